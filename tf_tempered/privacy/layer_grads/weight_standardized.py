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
"""WeightStandardizedConv2D: the Conv2D handler's paths, then the standardization's Jacobian.

The layer convolves with Ŵ[..., j] = (V[..., j] − μ_j) / σ_j, σ_j = sqrt(var_j + ε),
statistics over the n = kh·kw·cin entries of output channel j. With G = ∂ℓ/∂Ŵ (what
the Conv2D handler computes for a plain Conv2D fed the same input and output
gradient), per channel

    ∂ℓ/∂V = (G − mean(G) − Ŵ·mean(G⊙Ŵ)) / σ

(ε only enters through σ and Ŵ). The map is linear and the same for every example,
so the clipped sum is that map applied to the Conv2D handler's clipped sum. Its
squared norm, with K = G/σ, a = Σ K, b = Σ K⊙Ŵ per channel, is (Ŵ sums to 0 and
Σ Ŵ² = n·ρ, ρ_j = var_j / (var_j + ε))

    ‖∂ℓ/∂V‖² = Σ_j ‖K_j‖² − (a_j² + (2 − ρ_j)·b_j²) / n,

exact: ‖K‖² is the Conv2D handler's norm for the output gradient scaled by 1/σ (any of
its paths), and per microbatch a_j = Σ_r s_r·g'_rj and b_j = Σ_r z_rj·g'_rj over its
output pixels r, with g' = g/σ, z the recorded output less the bias (the patches
times Ŵ) and s_r the sum of the patch under r (a one-channel convolution of the
input summed over its channels). The bias's gradient is that of a Conv2D. A scaled
layer convolves with c·Ŵ (c = 1/√n): then K = c·G/σ (output gradient c·g/σ) and
b = Σ_r z_rj·g_rj/σ_j, z now being the patches times c·Ŵ. The
subtraction can lose digits where K lies almost in the span of 1 and Ŵ; it is
floored at 0.

>>> from tf_tempered import WeightStandardizedConv2D
>>> from tf_tempered.privacy import layer_grads
>>> layer = WeightStandardizedConv2D(4, 3)
>>> layer.build((None, 8, 8, 2))
>>> layer_grads.lookup(layer)[0].name
'weight_standardized_conv2d'
"""

import dataclasses
from typing import Any

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.layers import WeightStandardizedConv2D, standardize_kernel
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.conv import Conv2DHandler

__all__ = ["WeightStandardizedConv2DHandler", "WeightStandardizedHyperparameters"]


@dataclasses.dataclass(frozen=True)
class WeightStandardizedHyperparameters:
    """The Conv2D handler's parameters for the kernel alone (no bias), the bias, ε, c."""
    conv2d: Any
    use_bias: bool
    epsilon: float
    gain: float = 1.0


class _Scaled:
    """A recorded call with its output gradient divided by σ per channel (the Conv2D
    handler reads only these two)."""

    def __init__(self, inputs, grad_output):
        self.inputs = inputs
        self.grad_output = grad_output


@register(WeightStandardizedConv2D)
class WeightStandardizedConv2DHandler(Handler):
    """WeightStandardizedConv2D (channels_last), through the Conv2D paths."""

    name = "weight_standardized_conv2d"
    summary = ("as Conv2D for the output gradient scaled by 1/σ per channel (any of its paths), "
               "less closed-form terms from per-microbatch channel sums of it times the patch "
               "sums and the output: exact norms; the Conv2D clipped sum through the "
               "standardization's Jacobian")
    records_pre_activation = True

    def hyperparameters(self, layer):
        conv2d = _CONV2D.hyperparameters(layer)  # None for channels_first, LoRA, ...
        if conv2d is None:
            return None
        return WeightStandardizedHyperparameters(dataclasses.replace(conv2d, use_bias=False),
                                                 conv2d.use_bias, float(layer.epsilon),
                                                 float(layer.gain()))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        g = call.grad_output  # [B, oh, ow, cout]
        conv2d, m = hparams.conv2d, layout.num_microbatches
        # The statistics in float32 at least, as the layer computes them.
        wide = g.dtype if g.dtype.size >= 4 else tf.float32
        kernel = tf.cast(tf.convert_to_tensor(keras_bridge.watchable(call.layer.kernel)), wide)
        w_hat, var = standardize_kernel(kernel, hparams.epsilon)
        sigma = tf.sqrt(var + tf.constant(hparams.epsilon, wide))
        rho = tf.cast(var / tf.square(sigma), g.dtype)
        # K = c·G/σ: the Conv2D handler's kernel gradient for the output gradient c·g/σ.
        w_hat, g_scaled = tf.cast(w_hat, g.dtype), g * tf.cast(hparams.gain / sigma, g.dtype)
        kernel_norms = _CONV2D.layer_result(_Scaled(call.inputs, g_scaled), conv2d, layout)

        z = tf.cast(call.output, g.dtype)
        if hparams.use_bias:
            z -= tf.cast(tf.convert_to_tensor(keras_bridge.watchable(call.layer.bias)), g.dtype)
        per_microbatch = lambda t: tf.reduce_sum(clip.group_rows(t, m), 1)  # [M, cout]
        a = per_microbatch(_patch_sums(tf.cast(call.inputs, g.dtype), conv2d) * g_scaled)
        b = per_microbatch(z * g_scaled) / hparams.gain  # Σ K⊙Ŵ = Σ_r (z_r/c)·(c·g_r/σ)
        n = float(np.prod(conv2d.kernel_shape[:-1]))
        correction = tf.reduce_sum(tf.square(a) + (2.0 - rho) * tf.square(b), 1) / n
        sq = tf.maximum(kernel_norms.sq_norms - correction, 0.0)
        bias = per_microbatch(g) if hparams.use_bias else None
        if bias is not None:
            sq += tf.reduce_sum(tf.square(bias), 1)

        def clipped_sum(weights):
            k = kernel_norms.clipped_sum(weights)[0]  # Σ_m c_m·G_m/σ, the kernel's shape
            mean = lambda t: tf.reduce_mean(t, [0, 1, 2], keepdims=True)
            grads = [k - mean(k) - w_hat * mean(k * w_hat)]
            if bias is not None:
                grads.append(clip.weighted_sum(weights.zero_nonfinite(bias), weights.scale))
            return grads

        return LayerResult(sq, clipped_sum, kernel_norms.path)


def _patch_sums(x, hparams):
    """[B, oh, ow, cout]: the sum of the input patch under each output pixel, over the
    output channel's group of input channels (all of them without groups)."""
    groups, cout = hparams.groups, hparams.kernel_shape[-1]
    width = x.shape[-1] // groups
    summed = tf.stack([tf.reduce_sum(x[..., j * width:(j + 1) * width], -1)
                       for j in range(groups)], -1)  # [B, H, W, groups]
    kh, kw = hparams.kernel_size
    ones = tf.eye(groups, batch_shape=[kh, kw], dtype=x.dtype)  # each group its own sum
    sums = tf.nn.convolution(summed, ones, strides=list(hparams.strides),
                             padding=hparams.padding.upper(),
                             dilations=list(hparams.dilation_rate))
    return tf.repeat(sums, cout // groups, axis=-1)


_CONV2D = Conv2DHandler()
