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

:func:`scatternet_cnn`: GroupNorm (no trainable affine parameters, data-independent:
each example is normalized by its own statistics, so it costs no privacy and needs no
per-example gradient) → Conv 16, 3×3, stride 2 → act → Conv 32, 3×3 → act → Dense 32 →
act → Dense num_classes. They need no kymatio.
"""

import functools

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.layers import WeightStandardizedConv2D
from tf_tempered.models import resolve_activation

__all__ = ["scatternet_cnn", "scatternet_linear"]


def scatternet_cnn(activation="tanh", *, input_shape=(7, 7, 81), num_classes=10, groups=27,
                   normalization=None, weight_standardization=False, name="scatternet_cnn"):
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
    activations' inputs near unit variance).

    >>> scatternet_cnn("relu").count_params()
    33066
    >>> scatternet_cnn(weight_standardization=True).get_layer("conv2").scaled
    True
    """
    make_activation = resolve_activation(activation)
    conv = keras.layers.Conv2D
    if weight_standardization:
        conv = functools.partial(WeightStandardizedConv2D, scaled=True)
    inputs, x = _normalized_input(input_shape, groups, normalization)
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
                      name="scatternet_linear"):
    """Tramèr & Boneh's linear model on scattering features: logits = W·norm(x) + b.

    The input is normalized as in :func:`scatternet_cnn` (``groups`` or
    ``normalization``), flattened, and one Dense layer gives the logits.

    >>> scatternet_linear().count_params()
    39700
    """
    inputs, x = _normalized_input(input_shape, groups, normalization)
    x = keras.layers.Flatten(name="flatten")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def _normalized_input(input_shape, groups, normalization):
    """(the Input, its normalized tensor): GroupNorm, frozen (mean, variance) or neither."""
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
