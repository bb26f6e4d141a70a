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
"""Conv2DTranspose as a Conv2D with the roles of input and output gradient swapped.

A transposed convolution Z = conv_transpose(X, K) is the input gradient of the
convolution conv2d(Z, K) (same kernel [kh, kw, filters, cin], strides, padding
and dilation), so with G = ∂ℓ/∂Z

    ∂ℓ/∂K[k, i, o] = Σ_p G[p·s + k·d, i] · X[p, o]

— the kernel gradient of that Conv2D with input G and output gradient X. The
handler hands the Conv2D handler (every path: native op, depthwise backprop,
patches, ghost norms) the call (G, X); the bias, over Z's channels, is G summed
per microbatch, added here.
"""

import dataclasses

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.conv import Conv2DHandler, Conv2DHyperparameters

__all__ = ["Conv2DTransposeHandler", "ConvTransposeHyperparameters"]


@dataclasses.dataclass(frozen=True)
class ConvTransposeHyperparameters:
    """The equivalent Conv2D's parameters (input G, output gradient X; no bias) and the bias."""
    conv2d: Conv2DHyperparameters
    use_bias: bool


class _AsConv2D:
    """A recorded Conv2DTranspose call seen as the equivalent Conv2D call."""

    def __init__(self, call):
        self.inputs = call.grad_output
        self.grad_output = tf.cast(call.inputs, call.grad_output.dtype)


@register(keras.layers.Conv2DTranspose)
class Conv2DTransposeHandler(Handler):
    """Conv2DTranspose (channels_last, "same"/"valid") through the Conv2D paths."""

    name = "conv2d_transpose"
    summary = ("channels_last, any strides, dilations, padding and output_padding: the Conv2D "
               "handler's paths on (output gradient, input) in the roles of (input, output "
               "gradient); bias from the output gradients")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        padding, data_format = str(layer.padding).lower(), str(layer.data_format).lower()
        pair = lambda v: tuple(int(i) for i in (v if isinstance(v, (tuple, list)) else (v, v)))
        # Dilated (strides 1, as TF requires): the same Conv2D, dilated. On CPU such a
        # layer runs only with oneDNN (without it TF's Conv2DBackpropInput refuses
        # dilations, private or not).
        if (data_format != "channels_last" or padding not in ("same", "valid")
                or int(getattr(layer, "groups", 1) or 1) != 1
                or keras_bridge.derived_weights(layer)):
            return None  # channels_first, LoRA, quantized: the generic VJP
        kernel_shape = keras_bridge.shape_of(layer.kernel)  # [kh, kw, filters, cin]
        conv2d = Conv2DHyperparameters(layer.name, pair(layer.kernel_size), pair(layer.strides),
                                       pair(layer.dilation_rate), padding, kernel_shape[3], False,
                                       kernel_shape)
        return ConvTransposeHyperparameters(conv2d, bool(layer.use_bias))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        kernel = _CONV2D.layer_result(_AsConv2D(call), hparams.conv2d, layout)
        if not hparams.use_bias:
            return kernel
        # Per microbatch: G summed over its examples' pixels, [M, filters].
        bias = tf.reduce_sum(clip.group_rows(call.grad_output, layout.num_microbatches), 1)

        def clipped_sum(weights):
            return kernel.clipped_sum(weights) + [
                clip.weighted_sum(weights.zero_nonfinite(bias), weights.scale)]

        sq = kernel.sq_norms + tf.cast(tf.reduce_sum(tf.square(bias), 1), kernel.sq_norms.dtype)
        return LayerResult(sq, clipped_sum, kernel.path)


_CONV2D = Conv2DHandler()
