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
"""x̂ = ∂y/∂γ · 1 of a LayerNormalization: Keras 3's op without γ and β, or forward mode.

The handler's per-example values against per-example tapes: tests/test_conformance_normalization.py.
"""

import numpy as np
import pytest

from tf_tempered import keras_bridge
from tf_tempered._compat import KERAS_MAJOR, keras, tf


def _forward_mode_direction(layer, x):
    gamma = keras_bridge.watchable(layer.gamma)
    with tf.autodiff.ForwardAccumulator(gamma, tf.ones_like(gamma)) as acc:
        y = layer(x)
    return acc.jvp(y)


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 3's layer_normalization op")
@pytest.mark.parametrize("kwargs, shape", [
    ({}, (4, 5, 6)),
    ({"axis": [-1, 1]}, (3, 4, 5)),
    ({"center": False, "epsilon": 0.1}, (2, 7)),
])
def test_keras3_layer_normalization_gives_the_forward_mode_direction(kwargs, shape):
    x = tf.constant(np.random.default_rng(0).normal(size=shape) * 3 + 1, tf.float32)
    layer = keras.layers.LayerNormalization(**kwargs)
    layer.build(shape)
    layer.gamma.assign(np.random.default_rng(1).normal(size=layer.gamma.shape))
    direct = keras_bridge.layer_normalized_input(layer, x)
    expected = _forward_mode_direction(layer, x)
    assert direct.dtype == expected.dtype and direct.shape == expected.shape
    np.testing.assert_allclose(direct.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    # It is x̂ itself: zero mean, unit variance (up to ε) over the normalized axes.
    axes = tuple(a % len(shape) for a in np.atleast_1d(kwargs.get("axis", -1)))
    assert np.abs(direct.numpy().mean(axis=axes)).max() < 1e-5


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 3's layer_normalization op")
def test_mixed_precision_direction_has_the_compute_dtype():
    x = tf.constant(np.random.default_rng(2).normal(size=(3, 8)), tf.float16)
    layer = keras.layers.LayerNormalization(dtype="mixed_float16")
    layer.build((3, 8))
    direct = keras_bridge.layer_normalized_input(layer, x)
    expected = _forward_mode_direction(layer, x)
    assert direct.dtype == expected.dtype == tf.float16
    np.testing.assert_allclose(direct.numpy(), expected.numpy(), rtol=2e-3, atol=2e-3)


@pytest.mark.filterwarnings("ignore:You passed `rms_scaling=True`")  # Keras 3's deprecation
def test_variants_it_does_not_know_are_left_to_forward_mode():
    x = tf.ones([2, 4])

    class OwnCall(keras.layers.LayerNormalization):
        def call(self, inputs):
            return super().call(inputs) * 2.0

    layers = [OwnCall(), keras.layers.GroupNormalization(groups=2)]
    if KERAS_MAJOR == 3:
        layers.append(keras.layers.LayerNormalization(rms_scaling=True))
    else:  # tf-keras: its own (fused) implementation
        layers.append(keras.layers.LayerNormalization())
    for layer in layers:
        layer.build((2, 4))
        assert keras_bridge.layer_normalized_input(layer, x) is None, layer
