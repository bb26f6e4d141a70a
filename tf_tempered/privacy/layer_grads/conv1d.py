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
"""Conv1D as a Conv2D of height 1: every Conv2D path (native op, patches, ghost norms).

A Conv1D with kernel k, stride s and dilation d on [B, L, C] is the Conv2D with kernel
(1, k), stride (1, s) and dilation (1, d) on [B, 1, L, C]; "causal" padding is "valid"
after d·(k − 1) zeros on the left (what Keras' Conv1D does itself). The handler reshapes
the recorded tensors, lets the Conv2D handler compute norms and clipped sums, and
reshapes the kernel gradient back to [k, C, filters].
"""

import dataclasses
from typing import Any

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import keras_bridge
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.registry import derived_weights, register
from tf_tempered.privacy.layer_grads.conv import Conv2DHandler, Conv2DHyperparameters

__all__ = ["Conv1DHandler", "Conv1DHyperparameters"]


@dataclasses.dataclass(frozen=True)
class Conv1DHyperparameters:
    """The equivalent Conv2D's parameters and the left padding of a causal Conv1D."""
    conv2d: Conv2DHyperparameters
    causal_pad: int
    kernel_shape: Any


class _AsConv2D:
    """A recorded Conv1D call seen as the equivalent Conv2D call."""

    def __init__(self, call, params):
        x = call.inputs
        if params.causal_pad:
            x = tf.pad(x, [[0, 0], [params.causal_pad, 0], [0, 0]])
        self.inputs = x[:, None]
        self.grad_output = call.grad_output[:, None]


@register(keras.layers.Conv1D)
class Conv1DHandler(Handler):
    """Conv1D (channels_last; "same", "valid" or "causal") through the Conv2D paths."""

    name = "conv1d"
    summary = ("channels_last, any strides, dilations, groups and padding (causal included): "
               "the Conv2D handler's paths on [B, 1, L, C]")
    records_pre_activation = True

    def hyperparameters(self, layer):
        padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
        if (data_format != "channels_last" or padding not in ("same", "valid", "causal")
                or derived_weights(layer)):
            return None  # channels_first, LoRA, quantized: the generic VJP
        one = lambda v: int(v[0] if isinstance(v, (tuple, list)) else v)
        k, s, d = one(layer.kernel_size), one(layer.strides), one(layer.dilation_rate)
        kernel_shape = keras_bridge.shape_of(layer.kernel)
        conv2d = Conv2DHyperparameters(layer.name, (1, k), (1, s), (1, d),
                                       "valid" if padding == "causal" else padding,
                                       int(layer.filters), bool(layer.use_bias),
                                       (1,) + kernel_shape,
                                       int(getattr(layer, "groups", 1) or 1))
        return Conv1DHyperparameters(conv2d, d * (k - 1) if padding == "causal" else 0,
                                     kernel_shape)

    def variables(self, layer, params):
        return [layer.kernel, layer.bias] if params.conv2d.use_bias else [layer.kernel]

    def norms(self, call, params, step):
        norms = _CONV2D.norms(_AsConv2D(call, params), params.conv2d, step)

        def clipped_sum(weights):
            grads = norms.clipped_sum(weights)
            return [tf.reshape(grads[0], params.kernel_shape)] + grads[1:]

        return LayerResult(norms.sq_norms, clipped_sum, norms.path)


_CONV2D = Conv2DHandler()
