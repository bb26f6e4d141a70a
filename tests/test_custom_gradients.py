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
"""A gradient the forward pass defines itself is refused (privacy/custom_gradients.py)."""

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import UnsupportedLayerError, make_private


def _summed_over_the_batch(upstream):
    return tf.broadcast_to(tf.reduce_sum(upstream, 0, keepdims=True), tf.shape(upstream))


class _MixesInItsGradient(keras.layers.Layer):
    """The identity forward; backward, every row gets the batch's summed gradient."""

    def __init__(self, how="tf", **kwargs):
        super().__init__(**kwargs)
        self.how = how

    def call(self, x):
        decorator = tf.custom_gradient if self.how == "tf" else keras.ops.custom_gradient

        @decorator
        def identity(t):
            if self.how == "keras":  # Keras 3's custom_gradient passes (*upstream, variables)
                return tf.identity(t), lambda *args, **kwargs: _summed_over_the_batch(args[0])
            return tf.identity(t), _summed_over_the_batch

        return identity(x)


@pytest.mark.parametrize("how", ["tf"] + (["keras"] if KERAS_MAJOR == 3 else []))
def test_a_gradient_written_by_hand_is_refused_before_any_update(how):
    # Before: trained silently; each example's gradient held the others' (one example moved
    # the clipped sum by 4.3x the bound at batch 8, 11.8x at 32; probe Z).
    model = make_private(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(6, activation="tanh"), keras.layers.Dense(3),
        _MixesInItsGradient(how)]), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    with pytest.raises(UnsupportedLayerError, match=r"defines its own gradient.*Fix: compute "
                       r"it with TensorFlow's own gradients"):
        model.fit(x, np.zeros((8, 3), np.float32), batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_a_straight_through_estimator_by_stop_gradient_trains():
    # The fix the refusal names: TF's own gradients of x + stop_gradient(f(x) - x).
    class RoundedStraightThrough(keras.layers.Layer):
        def call(self, x):
            return x + tf.stop_gradient(tf.round(x) - x)

    model = make_private(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(6), RoundedStraightThrough(),
        keras.layers.Dense(3)]), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    model.fit(x, np.zeros((8, 3), np.float32), batch_size=4, verbose=0)
    assert all((a != b).any() for a, b in zip(before, model.get_weights()))
