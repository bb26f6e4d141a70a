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
"""Tramèr & Boneh's models on the features: the small CNN and the linear head.

:class:`FeaturePower`: an optional first layer, x ↦ sign(x)·|x|^p elementwise (a fixed,
data-independent compression of the heavy-tailed coefficients: no privacy cost).

:func:`scatternet_cnn`: GroupNorm (no trainable affine parameters, data-independent:
each example is normalized by its own statistics, so it costs no privacy and needs no
per-example gradient) → Conv 16, 3×3, stride 2 → act → Conv 32, 3×3 → act → Dense 32 →
act → Dense num_classes. They need no kymatio.
"""

import functools

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.activations import register_serializable
from tf_tempered.layers import WeightStandardizedConv2D
from tf_tempered.models import resolve_activation

__all__ = ["FeaturePower", "scatternet_cnn", "scatternet_linear"]


@register_serializable(package="tf_tempered")
class FeaturePower(keras.layers.Layer):
    """y = sign(x)·|x|^p, elementwise; no weights.

    Scattering coefficients are non-negative and heavy-tailed (order 0 ≫ order 2);
    p < 1 compresses them before normalization, as a power law (p → 0 tends to log).
    A fixed function of each example alone: it releases nothing and costs no privacy.

    >>> FeaturePower(0.5)(tf.constant([4.0, -9.0, 0.0])).numpy().tolist()
    [2.0, -3.0, 0.0]
    """

    def __init__(self, power, **kwargs):
        super().__init__(**kwargs)
        self.power = check_power(power)

    def call(self, inputs):
        magnitude = tf.math.pow(tf.abs(inputs), tf.cast(self.power, inputs.dtype))
        return tf.sign(inputs) * magnitude

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(power=self.power)
        return config


def check_power(power):
    """``power`` as a float if it is a finite number > 0, else a ValueError with the fix."""
    if isinstance(power, bool) or not isinstance(power, (int, float, np.number)) \
            or not np.isfinite(power) or power <= 0:
        raise ValueError(f"power={power!r} is invalid: it must be a finite number > 0, e.g. "
                         "0.5 (square root) or 1 (no compression).")
    return float(power)


def scatternet_cnn(activation="tanh", *, input_shape=(7, 7, 81), num_classes=10, groups=27,
                   normalization=None, weight_standardization=False, power=1.0,
                   name="scatternet_cnn"):
    """Tramèr & Boneh's MNIST / Fashion-MNIST CNN on scattering features.

    GroupNorm(groups, no affine parameters; ``groups=None``: no normalization) →
    Conv2D 16, 3×3, stride 2, 'same' + act → Conv2D 32, 3×3, 'same' + act → Flatten →
    Dense 32 + act → Dense num_classes (logits). ``activation`` takes any form of
    :func:`tf_tempered.models.resolve_activation`. ``normalization=(mean, variance)``
    (per channel; with ``groups=None``): a frozen (x − mean) / sqrt(variance) first
    instead, e.g. DP-released statistics (:mod:`tf_tempered.feature_stats`).
    ``weight_standardization=True``: both convolutions are
    :class:`tf_tempered.WeightStandardizedConv2D` with ``scaled=True`` (same
    parameters; no normalization follows them, so the fan-in scaling keeps the
    activations' inputs near unit variance). ``power`` ≠ 1: :class:`FeaturePower`
    before the normalization.

    >>> scatternet_cnn("relu").count_params()
    33066
    >>> scatternet_cnn(weight_standardization=True).get_layer("conv2").scaled
    True
    """
    make_activation = resolve_activation(activation)
    conv = keras.layers.Conv2D
    if weight_standardization:
        conv = functools.partial(WeightStandardizedConv2D, scaled=True)
    inputs, x = _normalized_input(input_shape, groups, normalization, power)
    x = conv(16, 3, strides=2, padding="same", name="conv1")(x)
    x = make_activation()(x)
    x = conv(32, 3, padding="same", name="conv2")(x)
    x = make_activation()(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(32, name="dense1")(x)
    x = make_activation()(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def scatternet_linear(*, input_shape=(7, 7, 81), num_classes=10, groups=27, normalization=None,
                      power=1.0, name="scatternet_linear"):
    """Tramèr & Boneh's linear model on scattering features: logits = W·norm(x^p) + b.

    The input is compressed and normalized as in :func:`scatternet_cnn` (``power``,
    ``groups`` or ``normalization``), flattened, and one Dense layer gives the logits.

    >>> scatternet_linear().count_params()
    39700
    >>> scatternet_linear(power=0.5).layers[1].name
    'feature_power'
    """
    inputs, x = _normalized_input(input_shape, groups, normalization, power)
    x = keras.layers.Flatten(name="flatten")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def _normalized_input(input_shape, groups, normalization, power):
    """(the Input, its normalized tensor): FeaturePower if power ≠ 1, then GroupNorm,
    frozen (mean, variance) or neither."""
    power = check_power(power)
    channels = input_shape[-1]
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                               or groups < 1 or channels % groups):
        raise ValueError(f"groups={groups!r} is invalid: it must divide the {channels} input "
                         "channels (e.g. 27, 81, 9, 3 or 1), or be None (no normalization).")
    if normalization is not None and groups is not None:
        raise ValueError("give groups=None with normalization=(mean, variance): the input is "
                         "normalized one way or the other, not both.")
    inputs = keras.Input(shape=tuple(input_shape), name="scattering")
    x = inputs
    if power != 1.0:
        x = FeaturePower(power, name="feature_power")(x)
    if normalization is not None:
        mean, variance = (np.asarray(v, dtype=np.float32).reshape(-1) for v in normalization)
        if mean.shape != (channels,) or variance.shape != (channels,) or (variance <= 0).any():
            raise ValueError(f"normalization must be (mean, variance) of {channels} channels "
                             f"each, variance > 0; got shapes {mean.shape}, {variance.shape}.")
        # Frozen constants (no trainable weights: nothing for DP-SGD to clip).
        x = keras.layers.Normalization(mean=mean, variance=variance, name="feature_norm")(x)
    if groups is not None:
        # No center/scale: nothing trainable, so DP-SGD has nothing here to clip.
        x = keras.layers.GroupNormalization(groups=groups, center=False, scale=False,
                                            epsilon=1e-5, name="group_norm")(x)
    return inputs, x
