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
"""Layers of the active Keras: the tempered sigmoid, and a weight-standardized Conv2D.

    φ(x) = s / (1 + exp(-T·x)) - o

``TemperedSigmoid`` goes wherever an activation layer goes, or as
``keras.layers.Dense(..., activation=TemperedSigmoid(...))``. It is elementwise,
so each example's output depends on that example alone (DP-SGD's per-example
gradients rely on this). It is a layer of the Keras tf_tempered runs on (see
``tf_tempered._compat``): Keras 3 by default, Keras 2 with ``TF_USE_LEGACY_KERAS=1``,
registered with it under the package ``"tf_tempered"``.

``WeightStandardizedConv2D`` is a Conv2D whose kernel is standardized per output
channel in every call (Qiao et al. 2019; with GroupNormalization it is De et al.'s
2022 DP-SGD recipe). The DP engine computes its per-example gradient norms in closed
form (privacy/layer_grads/weight_standardized.py).
"""

import math
import numbers

import numpy as np

from tf_tempered import keras_bridge
from tf_tempered._compat import keras, tf  # noqa: F401  (tf: used by the doctests)
from tf_tempered.activations import _Ops  # pylint: disable=protected-access
from tf_tempered.activations import check_tempered_sigmoid_args
from tf_tempered.activations import inverse_softplus
from tf_tempered.activations import positive_floor
from tf_tempered.activations import register_serializable
from tf_tempered.activations import tempered_sigmoid

__all__ = ["TemperedSigmoid", "WeightStandardizedConv2D", "standardize_kernel"]


@register_serializable(package="tf_tempered")
class TemperedSigmoid(keras.layers.Layer):
    """Tempered sigmoid layer: φ(x) = s·σ(T·x) - o, elementwise.

    Args:
        scale: s > 0 (finite).
        inverse_temperature: T > 0 (finite).
        offset: o (finite).
        learnable: if True, (s, T, o) are three scalar trainable weights of this
            layer (the paper's layer-wise parameters), initialized at the values
            above. s and T are stored through a softplus, s = softplus(ρ_s)
            (floored at the dtype's smallest normal number against underflow),
            so no gradient step can make them zero or negative; o is stored as is.
            If False (the default) the layer has no weights.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``...).

    Raises:
        ValueError: naming the argument, for a bad (s, T, o) or ``learnable``.

    The config stores the *initial* (s, T, o); trained values live in the weights
    and are restored by ``load_model`` / ``load_weights``. The properties
    ``scale``, ``inverse_temperature`` and ``offset`` give the current values.

    >>> import numpy as np
    >>> layer = TemperedSigmoid()  # (2, 2, 1): tanh
    >>> np.asarray(layer(tf.constant([[-1.0, 0.0, 1.0]])))
    array([[-0.7615942,  0.       ,  0.7615942]], dtype=float32)
    >>> layer = TemperedSigmoid(scale=1.5, inverse_temperature=3.0, offset=0.5,
    ...                         learnable=True)
    >>> _ = layer(tf.zeros((1, 2)))
    >>> [round(float(v), 6) for v in (layer.scale, layer.inverse_temperature, layer.offset)]
    [1.5, 3.0, 0.5]
    >>> len(layer.trainable_weights)
    3
    >>> TemperedSigmoid.from_config(layer.get_config()).learnable
    True
    """

    def __init__(self, scale=2.0, inverse_temperature=2.0, offset=1.0, learnable=False,
                 **kwargs):
        scale, inverse_temperature, offset = check_tempered_sigmoid_args(
            scale, inverse_temperature, offset, learnable=learnable, where="TemperedSigmoid")
        super().__init__(**kwargs)
        self.supports_masking = True
        self._initial = (scale, inverse_temperature, offset)
        self.learnable = bool(learnable)
        self._raw_scale = None
        self._raw_inverse_temperature = None
        self._offset_weight = None

    def build(self, input_shape):
        if self.learnable:
            scale, inverse_temperature, offset = self._initial
            self._raw_scale = self._scalar_weight("scale_raw", inverse_softplus(scale))
            self._raw_inverse_temperature = self._scalar_weight(
                "inverse_temperature_raw", inverse_softplus(inverse_temperature))
            self._offset_weight = self._scalar_weight("offset", offset)
        super().build(input_shape)

    def _scalar_weight(self, name, value):
        def initializer(shape, dtype=None, **unused_kwargs):
            # Rounded once, from float64, to the weight's dtype (Keras 3's Constant
            # would go through float32 and lose digits of a float64 weight).
            return _Ops.cast(np.full(shape, value, np.float64), dtype or _Ops.floatx())

        return self.add_weight(name=name, shape=(), trainable=True, initializer=initializer)

    @property
    def scale(self):
        """Current s: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_scale is None:
            return self._initial[0]
        return positive_floor(self._raw_scale)

    @property
    def inverse_temperature(self):
        """Current T: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_inverse_temperature is None:
            return self._initial[1]
        return positive_floor(self._raw_inverse_temperature)

    @property
    def offset(self):
        """Current o: a scalar tensor once a learnable layer is built, else a float."""
        if self._offset_weight is None:
            return self._initial[2]
        return _Ops.to_tensor(self._offset_weight)

    @property
    def offset_variable(self):
        """The trainable weight o of a built learnable layer (it enters φ as −o), else None."""
        return self._offset_weight

    def call(self, inputs):
        # Keras has already cast floating inputs to the compute dtype; the
        # activation casts the parameters to the dtype of `inputs`.
        return tempered_sigmoid(inputs, self.scale, self.inverse_temperature, self.offset)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        scale, inverse_temperature, offset = self._initial
        config.update(scale=scale, inverse_temperature=inverse_temperature, offset=offset,
                      learnable=self.learnable)
        return config


# Loading HDF5 (and SavedModel) looks a Dense's activation up by its bare class
# name rather than by the registered "tf_tempered>TemperedSigmoid"; keep a user's
# own "TemperedSigmoid" if they registered one first.
keras.utils.get_custom_objects().setdefault("TemperedSigmoid", TemperedSigmoid)


def standardize_kernel(kernel, epsilon):
    """(Ŵ, var): ``kernel`` [..., cout] standardized per output channel, and its variances.

    Ŵ[..., j] = (V[..., j] − mean_j) / sqrt(var_j + ε), with the mean and the (biased)
    variance var_j over every axis but the last. The one definition the layer's call
    and its DP handler use, in the dtype of ``kernel``.
    """
    kernel = tf.convert_to_tensor(kernel)
    axes = list(range(kernel.shape.rank - 1))
    mean = tf.reduce_mean(kernel, axes, keepdims=True)
    centered = kernel - mean
    var = tf.reduce_mean(tf.square(centered), axes)
    return centered * tf.math.rsqrt(var + tf.constant(epsilon, kernel.dtype)), var


@register_serializable(package="tf_tempered")
class WeightStandardizedConv2D(keras.layers.Conv2D):
    """Conv2D with a weight-standardized kernel (Qiao et al. 2019).

    Each call convolves with, per output channel j,

        Ŵ[..., j] = (V[..., j] − mean_j(V)) / sqrt(var_j(V) + ε)

    where V is the trainable ``kernel`` and the mean and (biased) variance are over
    its (kh, kw, cin) axes; the bias and activation are then as in Conv2D. With
    GroupNormalization it replaces BatchNormalization, which DP-SGD cannot use.
    ``scaled=True`` convolves with Ŵ/√n instead, n = kh·kw·cin the fan-in (scaled
    weight standardization, Brock et al. 2021): outputs keep the variance of unit-
    variance inputs, for a model with no normalization after the convolution (plain
    Ŵ would multiply it by about n, saturating a tanh that follows).

    Args:
        *args: Conv2D's arguments (``filters``, ``kernel_size``, ...).
        epsilon: ε > 0 (finite), added to each channel's variance. The default 1e-5
            is small against the per-channel variance of a Keras-initialized kernel
            (Glorot: 2/(fan_in + fan_out), ≥ 2e-4 up to 3×3×512 kernels), so Ŵ keeps
            a variance within 5% of 1, while it bounds the factor 1/σ_j of the
            kernel's gradient by 1/sqrt(ε) ≈ 316 for a channel whose weights collapse
            (σ_j = sqrt(var_j + ε); 1e-5 is also the ε of PyTorch's normalization layers).
        scaled: divide Ŵ by √(fan-in) (default False: Qiao et al.'s Ŵ).
        **kwargs: Conv2D's keyword arguments.

    Raises:
        ValueError: naming ``epsilon``, for one that is not a finite number > 0, or
            ``scaled``, for one that is not a bool.

    The statistics are computed in float32 at least (float16 would lose digits in the
    variance), from the kernel as the call reads it (in the compute dtype under a
    mixed-precision policy), and Ŵ is cast to the compute dtype.

    >>> import numpy as np
    >>> layer = WeightStandardizedConv2D(2, 3, use_bias=False)
    >>> y = layer(tf.ones((1, 5, 5, 1)))  # a constant image: Ŵ sums to 0 per channel
    >>> float(np.max(np.abs(np.asarray(y)))) < 1e-5
    True
    >>> w_hat = np.asarray(layer.standardized_kernel()).reshape(9, 2)  # [kh·kw·cin, filters]
    >>> [round(float(m), 5) + 0.0 for m in w_hat.mean(0)], [round(float(v), 3)
    ...                                                       for v in w_hat.var(0)]
    ([0.0, 0.0], [1.0, 1.0])
    >>> WeightStandardizedConv2D.from_config(layer.get_config()).epsilon
    1e-05
    """

    def __init__(self, *args, epsilon=1e-5, scaled=False, **kwargs):
        self.epsilon = check_epsilon(epsilon, where="WeightStandardizedConv2D")
        if not isinstance(scaled, (bool, np.bool_)):
            raise ValueError(f"WeightStandardizedConv2D: `scaled` must be True or False, got "
                             f"{scaled!r}. Fix: scaled=True divides the kernel by the square "
                             "root of its fan-in; scaled=False (the default) does not.")
        self.scaled = bool(scaled)
        super().__init__(*args, **kwargs)

    def gain(self):
        """The factor on Ŵ: 1/√(kh·kw·cin) with ``scaled``, else 1."""
        if not self.scaled:
            return 1.0
        return 1.0 / math.sqrt(float(np.prod(self.kernel.shape[:-1])))

    def standardized_kernel(self):
        """The kernel the call uses, gain·Ŵ (before the cast to the compute dtype)."""
        kernel = tf.convert_to_tensor(self.kernel)
        if kernel.dtype.size < 4:
            kernel = tf.cast(kernel, tf.float32)
        w_hat = standardize_kernel(kernel, self.epsilon)[0]
        return w_hat * self.gain() if self.scaled else w_hat

    def call(self, inputs):
        # Conv2D's call with Ŵ for the kernel: a call of its own, so that the Conv2D
        # handler (which would compute the gradient of Ŵ, not of V) never takes it.
        inputs = tf.convert_to_tensor(inputs)
        kernel = tf.cast(self.standardized_kernel(), inputs.dtype)
        jit_op = keras_bridge.grouped_convolution_op(self)
        if self.groups > 1 and jit_op is not None:
            # As tf-keras' Conv2D does (the bridge says why).
            outputs = jit_op(inputs, kernel)
        else:
            outputs = self.convolution_op(inputs, kernel)
        if self.use_bias:
            data_format = "NHWC" if self.data_format == "channels_last" else "NCHW"
            outputs = tf.nn.bias_add(outputs, tf.cast(self.bias, outputs.dtype),
                                     data_format=data_format)
        if self.activation is not None:
            return self.activation(outputs)
        return outputs

    def get_config(self):
        config = super().get_config()
        config.update(epsilon=self.epsilon, scaled=self.scaled)
        return config


def check_epsilon(epsilon, where):
    """``epsilon`` as a float if it is a finite number > 0, else a ValueError with the fix.

    >>> check_epsilon(0, "WeightStandardizedConv2D")
    Traceback (most recent call last):
    ...
    ValueError: WeightStandardizedConv2D: `epsilon` must be a finite number > 0, got 0. ...
    """
    if (isinstance(epsilon, numbers.Real) and not isinstance(epsilon, (bool, np.bool_))
            and math.isfinite(float(epsilon)) and float(epsilon) > 0):
        return float(epsilon)
    raise ValueError(f"{where}: `epsilon` must be a finite number > 0, got {epsilon!r}. "
                     "Fix: pass a small positive float, e.g. epsilon=1e-5 (the default), "
                     "which is added to each output channel's kernel variance.")
