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
"""DepthwiseConv2D (channels_last, "same"/"valid"): per-example kernel gradients, always kept.

Output channel (c, o) of a depthwise conv sees input channel c only, so example
b's kernel gradient is, per channel c and kernel tap k,

    ∂ℓ_b/∂W[k, c, o] = Σ_p x_b[p + k, c] · g_b[p, c, o]   (p: output pixels)

— at most kh·kw·cin·dm values per example, small enough to keep for every
microbatch (a matrix-vector clipped sum). A layer's path (`DepthwisePath`):

* native (CPU, float32/64, static image size; EngineOptions.native): the native op
  computes the sums above straight from x and g, examples in parallel
  (native/cc/depthwise_kernel_grads.cc);
* folded (TF ops, undilated): one depthwise-conv backprop with the batch folded into
  the channels (input channel (b, c) has output channels (b, c, o)): the
  backprop filter of [1, H, W, B·cin] is the per-example gradients;
* patches (dilated layers without the native op, or forced by norm_path="materialize"):
  image patches (conv_grads.patches) contracted with the output gradients per
  channel, an einsum.

The TF-ops paths take the batch in chunks of EngineOptions.depthwise_chunk examples.
On CPU the folded backprop is several times faster than the patches path, and the native
op 1.2–11x faster than the folded one (oneDNN's depthwise backprop-filter is slow on a
batch folded into thousands of channels; benchmarks/results/depthwise_native_ab.md).
"""

import dataclasses
from typing import Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import native
from tf_tempered.privacy.layer_grads import conv_grads
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import Handler, LayerPath
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["DepthwiseConv2DHandler", "DepthwiseHyperparameters", "DepthwisePath", "choose_path",
           "depthwise_norms", "per_example_kernel_grads"]


@dataclasses.dataclass(frozen=True)
class DepthwiseHyperparameters:
    """Plain hyperparameters of a depthwise convolution (conv_grads.patches reads them too)."""
    name: str
    kernel_size: Tuple[int, int]
    strides: Tuple[int, int]
    dilation_rate: Tuple[int, int]
    padding: str
    depth_multiplier: int
    use_bias: bool
    kernel_shape: Tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class DepthwisePath(LayerPath):
    """method: "native" (the native op), "folded" (depthwise backprop, batch folded into
    channels) or "patches"."""
    method: str
    materialize: bool = True  # always: rows.linear_norms reads it


def depthwise_hyperparameters(layer, kernel, use_bias):
    """DepthwiseHyperparameters of a DepthwiseConv2D or SeparableConv2D (None: not covered)."""
    padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
    if (data_format != "channels_last" or padding not in ("same", "valid")
            or keras_bridge.derived_weights(layer)):
        return None  # channels_first, LoRA, quantized: the generic VJP
    pair = lambda v: tuple(int(i) for i in (v if isinstance(v, (tuple, list)) else (v, v)))
    strides, dilation = pair(layer.strides), pair(layer.dilation_rate)
    if max(strides) > 1 and max(dilation) > 1:
        return None  # tf.nn.depthwise_conv2d refuses both (Keras does too)
    return DepthwiseHyperparameters(layer.name, pair(layer.kernel_size), strides, dilation,
                                    padding, int(layer.depth_multiplier), bool(use_bias),
                                    keras_bridge.shape_of(kernel))


@register(keras.layers.DepthwiseConv2D)
class DepthwiseConv2DHandler(Handler):
    """DepthwiseConv2D; channels_first takes the generic path."""

    name = "depthwise_conv2d"
    summary = ("channels_last, any depth_multiplier, strides, dilations and padding: "
               "per-microbatch kernel gradients from the native op on CPU, else one "
               "depthwise-conv backprop with the batch folded into channels (or image "
               "patches), kept for a matrix-vector clipped sum")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        return depthwise_hyperparameters(layer, keras_bridge.depthwise_kernel(layer),
                                         layer.use_bias)

    def variables(self, layer, hparams):
        kernel = keras_bridge.depthwise_kernel(layer)
        return [kernel, layer.bias] if hparams.use_bias else [kernel]

    def layer_result(self, call, hparams, layout):
        return depthwise_norms(call.inputs, call.grad_output, hparams, layout)


def choose_path(hparams, options, x=None, g=None):
    """The DepthwisePath of a layer (chosen while tracing) for its input x and output gradient g."""
    if x is not None and _native_applies(options, x, g):
        return DepthwisePath("native")
    # Not folded when dilated: TF 2.21's CPU depthwise backprop-filter ignores
    # `dilations` eagerly (wrong gradients) and fails in graphs, and
    # tf.nn.depthwise_conv2d's space-to-batch needs a static channel count,
    # which the folded batch does not have when the batch size is unknown.
    # depthwise_max_channel_pairs=0 turns the depthwise backprop off (the XLA steps: XLA
    # on CPU runs it several times slower than patches; step/plan.py).
    if options.forced == "materialize" or hparams.dilation_rate != (1, 1) or (
            options.forced != "depthwise" and options.depthwise_max_channel_pairs == 0):
        return DepthwisePath("patches")
    return DepthwisePath("folded")


def _native_applies(options, x, g):
    """The native op: asked for (not forced off) and able to take x and g (conv_grads)."""
    if not options.native or options.forced in ("ghost", "materialize", "depthwise"):
        return False
    return conv_grads.native_op_applies(x, g)


def depthwise_norms(x, g, hparams, layout):
    """Norms (kernel, bias) of a depthwise convolution from its input x and output gradient g."""
    path = choose_path(hparams, layout.options, x, g)
    num_microbatches = layout.num_microbatches
    per_row = per_example_kernel_grads(hparams, x, g, path, layout.options.depthwise_chunk)
    kernel = rows.kept_offsets_kernel(per_row, num_microbatches)
    src = rows.RowSource(x, g, hparams.kernel_size[0] * hparams.kernel_size[1], layout.options)
    return rows.linear_norms(src, path, layout, kernel_shape=hparams.kernel_shape,
                             use_bias=hparams.use_bias, kernel=kernel)


def per_example_kernel_grads(hparams, x, g, path, chunk):
    """Per-example ∂ℓ_b/∂W as [kh·kw, B, cin·dm] (examples on the middle axis, as folded gives)."""
    x = tf.cast(x, g.dtype)
    if path.method == "native":  # the whole batch at once, examples in parallel
        return native.depthwise_kernel_grads(
            x, g, kernel_size=hparams.kernel_size, strides=hparams.strides,
            dilations=hparams.dilation_rate, pads=conv_grads.padding_before(hparams, x))
    fn = _folded if path.method == "folded" else _from_patches
    batch = x.shape[0]
    if batch is not None:
        return tf.concat([fn(hparams, x[i:i + chunk], g[i:i + chunk])
                          for i in range(0, batch, chunk)], 1)

    def in_chunks():
        grads = conv_grads.map_padded_chunks(lambda xc, gc: fn(hparams, xc, gc), x, g, chunk,
                                             parallel_iterations=2)
        grads = tf.transpose(grads, [1, 0, 2, 3])  # [kh·kw, chunks, chunk, cin·dm]
        return tf.reshape(grads, [grads.shape[0], -1, grads.shape[-1]])[:, :tf.shape(x)[0]]

    return tf.cond(tf.shape(x)[0] <= chunk, lambda: fn(hparams, x, g), in_chunks)


def _folded(hparams, x, g):
    batch = tf.shape(x)[0]
    height, width, cin = x.shape[1], x.shape[2], x.shape[3]
    oh, ow = g.shape[1], g.shape[2]
    (kh, kw), dm = hparams.kernel_size, hparams.depth_multiplier
    x_folded = tf.reshape(tf.transpose(x, [1, 2, 0, 3]), [1, height, width, batch * cin])
    g_folded = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, oh, ow, batch * cin * dm])
    filters = tf.compat.v1.nn.depthwise_conv2d_native_backprop_filter(
        x_folded, tf.stack([kh, kw, batch * cin, dm]), g_folded,
        strides=[1, *hparams.strides, 1], padding=hparams.padding.upper())
    return tf.reshape(filters, [kh * kw, batch, cin * dm])


def _from_patches(hparams, x, g):
    (kh, kw), dm, cin = hparams.kernel_size, hparams.depth_multiplier, x.shape[-1]
    patches = tf.reshape(conv_grads.patches(hparams, x), [tf.shape(x)[0], -1, kh * kw, cin])
    g = tf.reshape(g, [tf.shape(g)[0], -1, cin, dm])
    return tf.reshape(tf.einsum("bpkc,bpcm->kbcm", patches, g), [kh * kw, -1, cin * dm])
