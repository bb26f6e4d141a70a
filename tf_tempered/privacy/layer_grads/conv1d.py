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
"""1-D convolutions as their 2-D forms of height 1: every path of the 2-D handlers.

A Conv1D with kernel k, stride s and dilation d on [B, L, C] is the Conv2D with kernel
(1, k), stride (1, s) and dilation (1, d) on [B, 1, L, C]; "causal" padding is "valid"
after d·(k − 1) zeros on the left (what Keras' Conv1D does itself). The same holds for
DepthwiseConv1D, SeparableConv1D and Conv1DTranspose with DepthwiseConv2D,
SeparableConv2D and Conv2DTranspose. Each handler reshapes the recorded tensors (and the
kernels a handler reads), lets the 2-D handler compute norms and clipped sums, and
reshapes the gradients back to the 1-D variables' shapes: the math, and its exactness,
are the 2-D handler's. E.g. Conv1D(8, 3, strides=2) on [B, 20, 4] is
Conv2D(8, (1, 3), strides=(1, 2)) on [B, 1, 20, 4], its kernel [3, 4, 8] the [1, 3, 4, 8] one.
"""

import dataclasses
from typing import Any, Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.conv import Conv2DHandler, Conv2DHyperparameters
from tf_tempered.privacy.layer_grads.conv_transpose import (Conv2DTransposeHandler,
                                                             ConvTransposeHyperparameters)
from tf_tempered.privacy.layer_grads.depthwise import DepthwiseHyperparameters, depthwise_norms
from tf_tempered.privacy.layer_grads.separable import SeparableHyperparameters, separable_norms

__all__ = ["Conv1DHandler", "Conv1DHyperparameters", "Conv1DTransposeHandler",
           "DepthwiseConv1DHandler", "HeightOneHyperparameters", "SeparableConv1DHandler"]


@dataclasses.dataclass(frozen=True)
class Conv1DHyperparameters:
    """The equivalent Conv2D's parameters and the left padding of a causal Conv1D."""
    conv2d: Conv2DHyperparameters
    causal_pad: int
    kernel_shape: Any


@dataclasses.dataclass(frozen=True)
class HeightOneHyperparameters:
    """as_2d: the 2-D handler's hyperparameters; causal_pad: zeros on the left of a causal
    layer's input; variable_shapes: the 1-D layer's variables' shapes, in order."""
    as_2d: Any
    causal_pad: int
    variable_shapes: Tuple[Tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class _Geometry:
    """A 1-D convolution's kernel size, stride, dilation, 2-D padding and causal left pad."""
    kernel_size: int
    stride: int
    dilation: int
    padding: str
    causal_pad: int


def _geometry(layer, paddings=("same", "valid", "causal")):
    """The layer's _Geometry, or None when no 2-D handler covers it (channels_first,
    another padding, LoRA or quantized weights: the generic VJP)."""
    padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
    if (data_format != "channels_last" or padding not in paddings
            or keras_bridge.derived_weights(layer)):
        return None
    one = lambda v: int(v[0] if isinstance(v, (tuple, list)) else v)
    k, s, d = one(layer.kernel_size), one(layer.strides), one(layer.dilation_rate)
    causal = padding == "causal"
    return _Geometry(k, s, d, "valid" if causal else padding, d * (k - 1) if causal else 0)


class _HeightOneCall:
    """A recorded 1-D call seen as the 2-D call on [B, 1, L, C] (causal: left-padded)."""

    def __init__(self, call, causal_pad):
        x = call.inputs
        if causal_pad:
            x = tf.pad(x, [[0, 0], [causal_pad, 0], [0, 0]])
        self.inputs = x[:, None]
        self.grad_output = call.grad_output[:, None]
        self.layer = call.layer


def _as_1d(result, variable_shapes):
    """The 2-D handler's LayerResult with its gradients reshaped to the 1-D variables."""
    def clipped_sum(weights):
        return [tf.reshape(grad, shape)
                for grad, shape in zip(result.clipped_sum(weights), variable_shapes)]

    return LayerResult(result.sq_norms, clipped_sum, result.path)


def _shapes(variables):
    return tuple(tuple(keras_bridge.shape_of(v)) for v in variables)


def _value(variable):
    """The variable's current value as a tensor (the step's own: nothing updated it yet)."""
    return tf.convert_to_tensor(keras_bridge.watchable(variable))


@register(keras.layers.Conv1D)
class Conv1DHandler(Handler):
    """Conv1D (channels_last; "same", "valid" or "causal") through the Conv2D paths."""

    name = "conv1d"
    summary = ("channels_last, any strides, dilations, groups and padding (causal included): "
               "the Conv2D handler's paths on [B, 1, L, C]")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        geometry = _geometry(layer)
        if geometry is None:
            return None
        g = geometry
        kernel_shape = keras_bridge.shape_of(layer.kernel)
        conv2d = Conv2DHyperparameters(layer.name, (1, g.kernel_size), (1, g.stride),
                                       (1, g.dilation), g.padding, int(layer.filters),
                                       bool(layer.use_bias), (1,) + kernel_shape,
                                       int(getattr(layer, "groups", 1) or 1))
        return Conv1DHyperparameters(conv2d, g.causal_pad, kernel_shape)

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.conv2d.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        result = _CONV2D.layer_result(_HeightOneCall(call, hparams.causal_pad), hparams.conv2d,
                                      layout)
        bias_shape = [(hparams.conv2d.filters,)] if hparams.conv2d.use_bias else []
        return _as_1d(result, [tuple(hparams.kernel_shape)] + bias_shape)


def _depthwise_2d(layer, geometry, kernel, use_bias):
    """The DepthwiseHyperparameters of a 1-D depthwise part (None: strided and dilated,
    which tf.nn.depthwise_conv2d refuses, as Keras does)."""
    g = geometry
    if g.stride > 1 and g.dilation > 1:
        return None
    # TF's depthwise convolutions take equal strides only: (s, s) and (d, d), the same
    # convolution on a height-1 input with a height-1 kernel (one output row either way).
    return DepthwiseHyperparameters(layer.name, (1, g.kernel_size), (g.stride, g.stride),
                                    (g.dilation, g.dilation), g.padding,
                                    int(layer.depth_multiplier),
                                    bool(use_bias), (1,) + tuple(keras_bridge.shape_of(kernel)))


@register(keras.layers.DepthwiseConv1D)
class DepthwiseConv1DHandler(Handler):
    """DepthwiseConv1D (channels_last) through the DepthwiseConv2D paths."""

    name = "depthwise_conv1d"
    summary = ("channels_last, any depth_multiplier, strides, dilations and padding: the "
               "DepthwiseConv2D handler's paths on [B, 1, L, C]")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        geometry = _geometry(layer)
        depthwise = geometry and _depthwise_2d(layer, geometry, keras_bridge.depthwise_kernel(layer),
                                               layer.use_bias)
        if not depthwise:
            return None
        return HeightOneHyperparameters(depthwise, geometry.causal_pad,
                                        _shapes(self.variables(layer, depthwise)))

    def variables(self, layer, hparams):
        kernel = keras_bridge.depthwise_kernel(layer)
        return [kernel, layer.bias] if layer.use_bias else [kernel]

    def layer_result(self, call, hparams, layout):
        call = _HeightOneCall(call, hparams.causal_pad)
        return _as_1d(depthwise_norms(call.inputs, call.grad_output, hparams.as_2d, layout),
                      hparams.variable_shapes)


@register(keras.layers.SeparableConv1D)
class SeparableConv1DHandler(Handler):
    """SeparableConv1D (channels_last) through the SeparableConv2D handler's math."""

    name = "separable_conv1d"
    summary = ("channels_last, any depth_multiplier, strides, dilations and padding: the "
               "SeparableConv2D handler's paths on [B, 1, L, C]")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        geometry = _geometry(layer)
        depthwise = geometry and _depthwise_2d(layer, geometry, layer.depthwise_kernel, False)
        if not depthwise:
            return None
        separable = SeparableHyperparameters(
            depthwise, (1,) + tuple(keras_bridge.shape_of(layer.pointwise_kernel)),
            bool(layer.use_bias))
        return HeightOneHyperparameters(separable, geometry.causal_pad,
                                        _shapes(self.variables(layer, separable)))

    def variables(self, layer, hparams):
        kernels = [layer.depthwise_kernel, layer.pointwise_kernel]
        return kernels + [layer.bias] if layer.use_bias else kernels

    def layer_result(self, call, hparams, layout):
        call = _HeightOneCall(call, hparams.causal_pad)
        depthwise_2d = tf.reshape(_value(call.layer.depthwise_kernel),
                                  hparams.as_2d.depthwise.kernel_shape)
        result = separable_norms(call.inputs, call.grad_output, depthwise_2d,
                                 _value(call.layer.pointwise_kernel), hparams.as_2d, layout)
        return _as_1d(result, hparams.variable_shapes)


@register(keras.layers.Conv1DTranspose)
class Conv1DTransposeHandler(Handler):
    """Conv1DTranspose (channels_last, "same"/"valid") through the Conv2DTranspose paths."""

    name = "conv1d_transpose"
    summary = ("channels_last, any strides, dilations, padding and output_padding: the "
               "Conv2DTranspose handler's paths on [B, 1, L, C]")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        geometry = _geometry(layer, paddings=("same", "valid"))
        if geometry is None or int(getattr(layer, "groups", 1) or 1) != 1:
            return None
        g = geometry
        kernel_shape = (1,) + tuple(keras_bridge.shape_of(layer.kernel))  # [1, k, filters, cin]
        conv2d = Conv2DHyperparameters(layer.name, (1, g.kernel_size), (1, g.stride),
                                       (1, g.dilation), g.padding, kernel_shape[3], False,
                                       kernel_shape)
        transpose = ConvTransposeHyperparameters(conv2d, bool(layer.use_bias))
        return HeightOneHyperparameters(transpose, 0, _shapes(self.variables(layer, transpose)))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if layer.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        result = _TRANSPOSE.layer_result(_HeightOneCall(call, 0), hparams.as_2d, layout)
        return _as_1d(result, hparams.variable_shapes)


_CONV2D = Conv2DHandler()
_TRANSPOSE = Conv2DTransposeHandler()
