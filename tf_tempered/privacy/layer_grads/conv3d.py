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
"""Conv3D (channels_last): rows are examples × output voxels.

The row a_r is the input volume patch under output voxel r, in the kernel's
(kd, kh, kw, cin) order: ``tf.extract_volume_patches`` for an undilated Conv3D;
for a dilated one (that op has no dilations) and under XLA (it has no XLA kernel)
the k_d·k_h·k_w strided slices of the padded input, one per kernel offset,
concatenated along the channels. The layer is
then a Dense on its patches: ghost norm or materialized per-microbatch gradients
(rows.py), patches made in chunks of ``patch_chunk_bytes``. The book-keeping sum is
the gradient of the layer's own convolution w.r.t. its kernel with the rescaled
output gradients. A grouped Conv3D is that many ungrouped ones on channel slices
(grouped.py).
"""

import dataclasses
from typing import Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import grouped, rows
from tf_tempered.privacy.layer_grads.contract import Handler
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["Conv3DHandler", "Conv3DHyperparameters"]


@dataclasses.dataclass(frozen=True)
class Conv3DHyperparameters:
    """Plain hyperparameters of a Conv3D."""
    name: str
    kernel_size: Tuple[int, int, int]
    strides: Tuple[int, int, int]
    padding: str
    use_bias: bool
    kernel_shape: Tuple[int, int, int, int, int]
    groups: int = 1
    dilation_rate: Tuple[int, int, int] = (1, 1, 1)

    def one_group(self):
        """The parameters of one group's ungrouped convolution (grouped.py)."""
        *kernel, cin, cout = self.kernel_shape
        return dataclasses.replace(self, kernel_shape=(*kernel, cin, cout // self.groups),
                                   groups=1)


@register(keras.layers.Conv3D)
class Conv3DHandler(Handler):
    """Conv3D through the row math on volume patches."""

    name = "conv3d"
    summary = ("channels_last, any strides, dilations, groups and padding: the Dense row math "
               "(ghost norm or materialized per-microbatch gradients) on volume patches made in "
               "chunks; book-keeping clipped sum by the convolution's own filter gradient")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
        triple = lambda v: tuple(int(i) for i in (v if isinstance(v, (tuple, list)) else (v,) * 3))
        if (data_format != "channels_last" or padding not in ("same", "valid")
                or keras_bridge.derived_weights(layer)):
            return None  # channels_first, LoRA, quantized: the generic VJP
        return Conv3DHyperparameters(layer.name, triple(layer.kernel_size), triple(layer.strides),
                                     padding, bool(layer.use_bias),
                                     keras_bridge.shape_of(layer.kernel),
                                     int(getattr(layer, "groups", 1) or 1),
                                     triple(layer.dilation_rate))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        if hparams.groups > 1:
            return grouped.grouped_norms(self.layer_result, call, hparams.one_group(),
                                         hparams.groups, layout)
        x = call.inputs
        kd, kh, kw = hparams.kernel_size
        src = rows.RowSource(x, call.grad_output, kd * kh * kw * x.shape[-1], layout.options,
                             to_rows=lambda xs: _volume_patches(hparams, xs, layout.xla),
                             chunked=True)
        path = rows.RowsPath(rows.choose_materialize(src, layout.num_microbatches,
                                                     layout.examples_per_microbatch))
        return rows.linear_norms(src, path, layout, kernel_shape=hparams.kernel_shape,
                                 use_bias=hparams.use_bias,
                                 book_keeping=lambda w: _book_keeping(src, hparams, w))


def _volume_patches(hparams, x, xla=False):
    # XLA has no ExtractVolumePatches kernel: strided slices under jit_compile.
    if hparams.dilation_rate == (1, 1, 1) and not xla:
        return tf.extract_volume_patches(x, ksizes=[1, *hparams.kernel_size, 1],
                                         strides=[1, *hparams.strides, 1],
                                         padding=hparams.padding.upper())
    return _dilated_volume_patches(hparams, x)


def _dilated_volume_patches(hparams, x):
    """The patches of a dilated Conv3D: [B, od, oh, ow, kd·kh·kw·cin], kernel order.

    One strided slice of the zero-padded input per kernel offset (a, b, c): the
    input values under that kernel tap at every output voxel. Spatial sizes may be
    unknown while tracing (the slice bounds are then tensors).
    """
    sizes = [x.shape[i + 1] if x.shape[i + 1] is not None else tf.shape(x)[i + 1]
             for i in range(3)]
    outs, pads = [], [[0, 0]]
    for size, k, s, d in zip(sizes, hparams.kernel_size, hparams.strides, hparams.dilation_rate):
        extent = (k - 1) * d + 1
        if hparams.padding == "valid":
            out, before, after = (size - extent) // s + 1, 0, 0
        else:  # "same", as TF pads: ceil(size / s) outputs, the odd pixel after
            out = -(-size // s)
            total = tf.maximum((out - 1) * s + extent - size, 0) if tf.is_tensor(size) else max(
                (out - 1) * s + extent - size, 0)
            before, after = total // 2, total - total // 2
        outs.append(out)
        pads.append([before, after])
    x = tf.pad(x, pads + [[0, 0]])
    taps = []
    for a in range(hparams.kernel_size[0]):
        for b in range(hparams.kernel_size[1]):
            for c in range(hparams.kernel_size[2]):
                begin = [o * d for o, d in zip((a, b, c), hparams.dilation_rate)]
                end = [start + (out - 1) * s + 1
                       for start, out, s in zip(begin, outs, hparams.strides)]
                taps.append(tf.strided_slice(x, [0, *begin, 0], [0, *end, 0],
                                             [1, *hparams.strides, 1],
                                             begin_mask=0b10001, end_mask=0b10001))
    return tf.concat(taps, axis=-1)


def _book_keeping(src, hparams, weights):
    """(Σ_r a_r (c_{m(r)} g_r)ᵀ, the rescaled c·g): the filter gradient of the convolution
    (it does not depend on the kernel's values: zeros here)."""
    g = weights.zero_nonfinite(src.grad_output, per_example=True)
    g *= clip.per_example(weights.scale, g)
    x = weights.zero_nonfinite(tf.cast(src.inputs, g.dtype), per_example=True)
    kernel = tf.zeros(hparams.kernel_shape, g.dtype)
    with tf.GradientTape() as tape:
        tape.watch(kernel)
        z = tf.nn.convolution(x, kernel, strides=list(hparams.strides),
                              padding=hparams.padding.upper(),
                              dilations=list(hparams.dilation_rate))
    return tape.gradient(z, kernel, output_gradients=g), g
