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
"""SeparableConv2D: a depthwise convolution, then a pointwise (1×1) one and the bias.

The layer computes U = depthwise(X, D) and Z = U·P + b per pixel. With G = ∂ℓ/∂Z
recorded, the pointwise kernel and bias are a Dense on the rows of U (ghost norm
or materialized, rows.py), and the depthwise kernel a DepthwiseConv2D with output
gradient ∂ℓ/∂U = G·Pᵀ (depthwise.py). The layer does not expose U: it is
recomputed from the recorded X (one depthwise convolution, a small part of the
layer's cost). A microbatch's squared norm is the sum of the two parts'.
"""

import dataclasses
from typing import Any, Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import Handler, LayerPath, LayerResult
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.depthwise import depthwise_norms, depthwise_hyperparameters

__all__ = ["SeparableConv2DHandler", "SeparableHyperparameters", "SeparablePath",
           "separable_norms"]


@dataclasses.dataclass(frozen=True)
class SeparableHyperparameters:
    """The depthwise part's DepthwiseHyperparameters (no bias), the pointwise kernel's shape and
    the bias."""
    depthwise: Any
    pointwise_shape: Tuple[int, int, int, int]
    use_bias: bool


@dataclasses.dataclass(frozen=True)
class SeparablePath(LayerPath):
    """The depthwise part's DepthwisePath and the pointwise part's rows.RowsPath."""
    depthwise: Any
    pointwise: Any


@register(keras.layers.SeparableConv2D)
class SeparableConv2DHandler(Handler):
    """SeparableConv2D; channels_first takes the generic path."""

    name = "separable_conv2d"
    summary = ("channels_last, any depth_multiplier, strides, dilations and padding: the "
               "depthwise kernel as DepthwiseConv2D (output gradient G·Pᵀ), the pointwise kernel "
               "and bias as a Dense on the recomputed depthwise output")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        depthwise = depthwise_hyperparameters(layer, layer.depthwise_kernel, use_bias=False)
        if depthwise is None:
            return None
        return SeparableHyperparameters(depthwise, keras_bridge.shape_of(layer.pointwise_kernel),
                                        bool(layer.use_bias))

    def variables(self, layer, hparams):
        kernels = [layer.depthwise_kernel, layer.pointwise_kernel]
        return kernels + [layer.bias] if hparams.use_bias else kernels

    def layer_result(self, call, hparams, layout):
        return separable_norms(call.inputs, call.grad_output,
                               _value(call.layer.depthwise_kernel),
                               _value(call.layer.pointwise_kernel), hparams, layout)


def separable_norms(x, g, depthwise_kernel, pointwise_kernel, hparams, layout):
    """The LayerResult of a separable convolution from its input x [B, H, W, cin], output
    gradient g [B, oh, ow, filters] and kernels' values ([kh, kw, cin, dm], any shape of
    cin·dm × filters values)."""
    dw = hparams.depthwise
    x = tf.cast(x, g.dtype)
    depthwise_kernel = tf.cast(depthwise_kernel, g.dtype)
    pointwise = tf.reshape(tf.cast(pointwise_kernel, g.dtype),
                           hparams.pointwise_shape[-2:])  # [cin·dm, filters]
    u = tf.nn.depthwise_conv2d(x, depthwise_kernel, strides=[1, *dw.strides, 1],
                               padding=dw.padding.upper(), dilations=list(dw.dilation_rate))
    pointwise_src = rows.RowSource(u, g, pointwise.shape[0], layout.options)
    pointwise_path = rows.RowsPath(rows.choose_materialize(
        pointwise_src, layout.num_microbatches, layout.examples_per_microbatch))
    pointwise_norms = rows.linear_norms(pointwise_src, pointwise_path, layout,
                                        kernel_shape=hparams.pointwise_shape,
                                        use_bias=hparams.use_bias)
    grad_u = tf.tensordot(g, pointwise, [[3], [1]])  # ∂ℓ/∂U = G·Pᵀ
    depthwise = depthwise_norms(x, grad_u, dw, layout)

    def clipped_sum(weights):
        return depthwise.clipped_sum(weights) + pointwise_norms.clipped_sum(weights)

    return LayerResult(depthwise.sq_norms + pointwise_norms.sq_norms, clipped_sum,
                       SeparablePath(depthwise.path, pointwise_path))


def _value(variable):
    """The variable's current value as a tensor (the step's own: nothing updated it yet)."""
    return tf.convert_to_tensor(keras_bridge.watchable(variable))
