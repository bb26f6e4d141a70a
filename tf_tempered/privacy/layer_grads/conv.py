# Copyright 2026 The tf_tempered Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Conv2D (channels_last, "same"/"valid"): rows are examples × output pixels.

The row a_r is the input patch under output pixel r. A layer's path (`ConvPath`):

* native: the native op (CPU, privacy/native) gives G_m and ‖G_m‖² straight from
  the image, no patch tensor; with many output pixels G_m is kept for a
  matrix-vector clipped sum, else only the norms (book-keeping sum);
* depthwise (TF ops, few channel pairs, undilated): per-example kernel
  gradients from one depthwise-conv backprop (conv_grads.py), always kept;
* otherwise ghost norm or materialized gradients (rows.py), the book-keeping sum by
  TF's backprop-filter op. Materialized gradients are formed (`ConvPath.kept_by`,
  conv_grads.py) from one product per block of stride×stride kernel offsets
  ("blocks": strided layers under TF's executor where its kernels are not
  oneDNN's), from one product per kernel offset ("offsets": XLA steps, which fuse
  each product without a patch tensor), or from input patches ("patches").

The thresholds are EngineOptions (options.py), set from CPU measurements
(docs/benchmarks.md, "Measurements behind the engine's defaults"). A grouped Conv2D
is that many ungrouped ones on channel slices (grouped.py).
"""

import dataclasses
from typing import Any, Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy import native
from tf_tempered.privacy.layer_grads import conv_grads
from tf_tempered.privacy.layer_grads import grouped, rows
from tf_tempered.privacy.layer_grads.contract import FusedClippedSum, Handler, LayerPath
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["Conv2DHandler", "Conv2DHyperparameters", "ConvPath", "choose_path"]


@dataclasses.dataclass(frozen=True)
class Conv2DHyperparameters:
    """Plain hyperparameters of a Conv2D (the attribute names conv_grads and native read)."""
    name: str
    kernel_size: Tuple[int, int]
    strides: Tuple[int, int]
    dilation_rate: Tuple[int, int]
    padding: str
    filters: int
    use_bias: bool
    kernel_shape: Tuple[int, int, int, int]
    groups: int = 1

    def one_group(self):
        """The parameters of one group's ungrouped convolution (grouped.py)."""
        kh, kw, cin, cout = self.kernel_shape
        return dataclasses.replace(self, filters=self.filters // self.groups,
                                   kernel_shape=(kh, kw, cin, cout // self.groups), groups=1)


@dataclasses.dataclass(frozen=True)
class ConvPath(LayerPath):
    """native: the native op; depthwise: the depthwise backprop; materialize: as rows.RowsPath;
    kept_by: how materialized gradients are formed, "patches", "offsets" or "blocks"."""
    native: bool
    depthwise: bool
    materialize: Any
    kept_by: str = "patches"


@register(keras.layers.Conv2D)
class Conv2DHandler(Handler):
    """Conv2D (channels_last); channels_first and LoRA/quantized take the generic path."""

    name = "conv2d"
    summary = ("channels_last, any strides, dilations, padding and groups: per-microbatch kernel "
               "gradients by the native CPU op, a depthwise backprop or image patches, or ghost "
               "norms from patches, whichever is cheaper for the shape; book-keeping clipped sum; "
               "groups > 1 as that many ungrouped convolutions on channel slices")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        # Keras 2 and 3 store padding and data_format lower-case, the sizes as tuples
        # (lists in some configs): normalized here all the same.
        padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
        if (data_format != "channels_last" or padding not in ("same", "valid")
                or keras_bridge.derived_weights(layer)):
            return None  # channels_first, causal, LoRA, quantized: the generic VJP
        pair = lambda v: tuple(int(i) for i in (v if isinstance(v, (tuple, list)) else (v, v)))
        return Conv2DHyperparameters(layer.name, pair(layer.kernel_size), pair(layer.strides),
                                     pair(layer.dilation_rate), padding, int(layer.filters),
                                     bool(layer.use_bias), keras_bridge.shape_of(layer.kernel),
                                     int(getattr(layer, "groups", 1) or 1))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        if hparams.groups > 1:
            return grouped.grouped_norms(self.layer_result, call, hparams.one_group(),
                                         hparams.groups, layout)
        src = _row_source(call.inputs, call.grad_output, hparams, layout.options)
        path = choose_path(src, hparams, layout.num_microbatches, layout.examples_per_microbatch,
                           xla=layout.xla)
        kernel, bias = None, None
        if path.native:
            kernel, bias = _native_kernel(src, hparams, path, layout.num_microbatches)
        elif path.depthwise:
            kernel = rows.kept_offsets_kernel(conv_grads.per_example_kernel_grads(
                hparams, src.inputs, src.grad_output, chunk=src.options.depthwise_chunk),
                layout.num_microbatches)
        elif path.kept_by != "patches":
            by = {"offsets": conv_grads.per_example_kernel_grads_by_offsets,
                  "blocks": conv_grads.per_example_kernel_grads_by_blocks}[path.kept_by]
            kernel = rows.kept_offsets_kernel(by(hparams, src.inputs, src.grad_output),
                                  layout.num_microbatches)
        result = rows.linear_norms(src, path, layout, kernel_shape=hparams.kernel_shape,
                                   use_bias=hparams.use_bias, kernel=kernel,
                                   book_keeping=lambda w: _book_keeping(src, hparams, w),
                                   bias_per_microbatch=None if bias is None else lambda m: bias)
        if path.native and path.materialize is False and src.options.fused_clipped_sum:
            result = dataclasses.replace(result, fused=_fused_sum(src, hparams, layout))
        return result


def _row_source(x, g, hparams, options):
    kh, kw = hparams.kernel_size
    return rows.RowSource(x, g, kh * kw * x.shape[-1], options,
                          to_rows=lambda xs: conv_grads.patches(hparams, xs), chunked=True)


def choose_path(src, hparams, num_microbatches, examples_per_microbatch, *, xla=False):
    """The ConvPath for this call (chosen while tracing); xla: the step is XLA-compiled."""
    options = src.options
    g_rows = rows.static_rows(src.grad_output, examples_per_microbatch)
    if g_rows is not None and _use_native(src, hparams, g_rows):
        # Materialized gradients (for a matrix-vector clipped sum) cost memory
        # traffic; the book-keeping sum instead costs the batch's filter gradient,
        # rows·d_in·d_out per microbatch: worth avoiding only for many rows.
        return ConvPath(True, False, g_rows >= options.native_materialize_min_rows
                        and rows.fits(src, num_microbatches, examples_per_microbatch))
    max_pairs = options.conv2d_depthwise_max_channel_pairs(keras_bridge.onednn_enabled())
    if hparams.dilation_rate == (1, 1) and hparams.strides[0] == hparams.strides[1] and (
            options.forced == "depthwise" or options.forced is None and (
                src.inputs.shape[-1] * hparams.filters <= max_pairs)):
        # Not for dilated convolutions: TF 2.21's CPU depthwise backprop-filter
        # ignores `dilations` eagerly (wrong per-example gradients) and fails in
        # graphs (oneDNN: AbortedError; without: InvalidArgumentError). Nor for
        # unequal strides (a strided Conv1D's (1, s)): without oneDNN that kernel
        # supports equal row and column strides only (InvalidArgumentError).
        return ConvPath(False, True, True)
    materialize = rows.choose_materialize(src, num_microbatches, examples_per_microbatch)
    return ConvPath(False, False, materialize, _kept_by(src, hparams, materialize, xla))


def _kept_by(src, hparams, materialize, xla):
    """How kept gradients are formed: "patches", "offsets" or "blocks" (conv_grads.py).

    Measured on the MNIST CNN (benchmarks/results/conv_blocks.md): under TF's executor,
    one op per product, the blocks of a strided layer beat patches where TF's kernels are
    Eigen's (conv1: 11.0 against 33.5 ms; the TF-ops step 1.41-1.45x → 1.02-1.07x
    non-private), not where they are oneDNN's (conv2: 89.8 against 5.6 ms; conv1 takes
    the depthwise backprop there). Under XLA, which fuses each product without a patch
    tensor, the products per offset beat patches; blocks gained nothing consistent in the
    XLA step (1.18-1.26x against 1.22-1.23x). EngineOptions.conv_blocks overrides. Both
    need static spatial sizes; the blocks, a strided undilated layer.
    """
    static = None not in src.inputs.shape[1:3] + src.grad_output.shape[1:3]
    if not static or tf.is_tensor(materialize) or not materialize:
        return "patches"
    blocks = src.options.conv_blocks
    if blocks is None:
        blocks = not xla and not keras_bridge.onednn_enabled()
    if blocks and hparams.strides != (1, 1) and hparams.dilation_rate == (1, 1):
        return "blocks"
    return "offsets" if xla else "patches"


def _use_native(src, hparams, g_rows):
    """Whether the native op gives this Conv2D's norms (and maybe its gradients)."""
    options = src.options
    if not options.native or options.forced in ("ghost", "materialize", "depthwise"):
        return False
    if not conv_grads.native_op_applies(src.inputs, src.grad_output):
        return False
    if options.forced == "native":
        return True
    # Its cost per microbatch is rows·d_in·d_out multiply-adds, the ghost norm's rows²·(d_in + d_out).
    d_in, d_out = src.d_in, src.grad_output.shape[-1]
    return d_in * d_out <= max(g_rows, options.native_min_ghost_rows) * (d_in + d_out)


def _native_kernel(src, hparams, path, num_microbatches):
    """(KernelGrads, the bias's per-microbatch gradients [M, cout] or None) by the native op,
    which sums the bias's gradients as it reads g (no separate pass over g's pixels)."""
    def native_grads(output_grads):
        return native.conv2d_group_kernel_grads(
            src.inputs, src.grad_output, num_microbatches, kernel_size=hparams.kernel_size,
            strides=hparams.strides, dilations=hparams.dilation_rate,
            pads=conv_grads.padding_before(hparams, src.inputs), output_grads=output_grads,
            bias_grads=hparams.use_bias)

    materialize = path.materialize
    if isinstance(materialize, bool):
        sq, per_microbatch, bias = native_grads(materialize)
    else:
        sq, per_microbatch, bias = tf.cond(materialize, lambda: native_grads(True),
                                           lambda: native_grads(False))
    kernel = rows.KernelGrads(sq, lambda w: clip.weighted_sum(w.zero_nonfinite(per_microbatch),
                                                              w.scale))
    return kernel, bias if hparams.use_bias else None


def _fused_sum(src, hparams, layout):
    """FusedClippedSum by the native op: this layer's norms and clipped sum in one pass over
    its per-microbatch gradients, instead of its norms now and TF's backprop-filter op over
    c·g once the clip factors are known (MNIST CNN conv2: docs/engine.md)."""
    def run(other_sq_norms, l2_norm_clip):
        sq, scale, kernel, bias = native.conv2d_clipped_kernel_sum(
            src.inputs, src.grad_output, layout.num_microbatches, other_sq_norms, l2_norm_clip,
            kernel_size=hparams.kernel_size, strides=hparams.strides,
            dilations=hparams.dilation_rate, pads=conv_grads.padding_before(hparams, src.inputs),
            bias_grads=hparams.use_bias)
        return sq, scale, [kernel, bias] if hparams.use_bias else [kernel]

    g = src.grad_output
    return FusedClippedSum(run, cost=g.shape[1] * g.shape[2] * src.d_in * g.shape[-1])


def _book_keeping(src, hparams, weights):
    """(Σ_r a_r (c_{m(r)} g_r)ᵀ, the rescaled c·g): for a convolution that product
    is TF's own conv backprop-filter op."""
    g = weights.zero_nonfinite(src.grad_output, per_example=True)
    g *= clip.per_example(weights.scale, g)
    x = weights.zero_nonfinite(tf.cast(src.inputs, g.dtype), per_example=True)
    if hparams.dilation_rate != (1, 1):
        return _dilated_filter_grad(hparams, x, g), g
    return tf.compat.v1.nn.conv2d_backprop_filter(
        x, tf.constant(list(hparams.kernel_shape)), g, strides=[1, *hparams.strides, 1],
        padding=hparams.padding.upper(), dilations=[1, *hparams.dilation_rate, 1]), g


def _dilated_filter_grad(hparams, x, g):
    """Σ_r a_r g_rᵀ of a dilated Conv2D: the gradient of the layer's own convolution.

    TF's CPU backprop-filter kernel refuses dilations (float64 always; float32
    without oneDNN), while tf.nn.convolution (the layer's own op, which dilates
    by space-to-batch where the kernel cannot) back-propagates wherever the
    layer trains. The gradient does not depend on the kernel's values (zeros
    here), and its forward output is not needed (graph pruning can drop it).
    """
    kernel = tf.zeros(hparams.kernel_shape, g.dtype)
    with tf.GradientTape() as tape:
        tape.watch(kernel)
        z = tf.nn.convolution(x, kernel, strides=list(hparams.strides),
                              padding=hparams.padding.upper(),
                              dilations=list(hparams.dilation_rate))
    return tape.gradient(z, kernel, output_gradients=g)
