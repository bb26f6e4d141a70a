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

import functools

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import UnsupportedLayerError, make_private

from dp_reference import assert_exact_update


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


def _mixing_identity(t):
    """The identity forward; backward, every row gets the batch's summed gradient."""
    @tf.custom_gradient
    def identity(u):
        return tf.identity(u), _summed_over_the_batch
    return identity(t)


class _MixingCell(keras.layers.Layer):
    """A recurrent cell whose state goes through _mixing_identity."""

    def __init__(self, units=3, **kwargs):
        super().__init__(**kwargs)
        self.units, self.state_size = units, units
        self.dense = keras.layers.Dense(units)

    def call(self, inputs, states):
        output = _mixing_identity(tf.tanh(self.dense(inputs) + states[0]))
        return output, [output]


@pytest.mark.parametrize("where", ["dense_activation", "conv_activation", "rnn_cell"])
def test_a_gradient_written_by_hand_inside_a_keras_layer_s_call_is_refused(where):
    # Before: ops inside the call of a layer whose call is Keras' own were trusted, the user
    # code it runs too (its activation, an RNN's cell): one example moved the clipped sum by
    # 6.9-11.6x the bound (probe S, F2).
    hidden = {"dense_activation": lambda: [keras.layers.Dense(4, activation=_mixing_identity)],
              "conv_activation": lambda: [keras.layers.Conv1D(4, 1, activation=_mixing_identity),
                                          keras.layers.Flatten()],
              "rnn_cell": lambda: [keras.layers.RNN(_MixingCell())]}[where]()
    shape = (5,) if where == "dense_activation" else (2, 5)
    model = make_private(keras.Sequential([keras.Input(shape), *hidden, keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.random.default_rng(0).normal(size=(8, *shape)).astype(np.float32)
    model(x[:1])  # builds the cell's Dense (Keras 3 builds it at the first call)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match=r"defines its own gradient"):
        model.fit(x, np.zeros((8, 3), np.float32), batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


@pytest.mark.parametrize("where", ["activation_layer", "lambda", "custom_layer"])
def test_tensorflow_s_own_custom_gradients_train_exactly(where):
    # Before: tf.nn.silu (swish), which TF writes with tf.custom_gradient, was refused
    # (probe S, F3: Activation("swish") in every EfficientNet-like block).
    class Swish(keras.layers.Layer):
        def call(self, x):
            return tf.nn.swish(x)

    def build(dtype="float32"):
        swish = {"activation_layer": lambda: keras.layers.Activation("swish", dtype=dtype),
                 "lambda": lambda: keras.layers.Lambda(tf.nn.silu, dtype=dtype),
                 "custom_layer": lambda: Swish(dtype=dtype)}[where]()
        return keras.Sequential([keras.Input((5,), dtype=dtype), keras.layers.Dense(6, dtype=dtype),
                                 swish, keras.layers.Dense(3, dtype=dtype)])

    x = np.random.default_rng(0).normal(size=(16, 5))
    assert_exact_update(build, x, np.arange(16) % 3)


class _SummedOverTheBatch:
    def __call__(self, upstream):
        return _summed_over_the_batch(upstream)


_GRADIENT_FORMS = {
    "tf.math.cumsum": lambda: lambda u: tf.math.cumsum(u, axis=0),
    "a partial of tf.reverse": lambda: functools.partial(tf.reverse, axis=[0]),
    "a callable object": _SummedOverTheBatch,
    "a tf.function": lambda: tf.function(_summed_over_the_batch),
}


class _ReturnsAGradientOf(keras.layers.Layer):
    def __init__(self, form, **kwargs):
        super().__init__(**kwargs)
        self.form = form

    def call(self, x):
        gradient = _GRADIENT_FORMS[self.form]()

        @tf.custom_gradient
        def identity(t):
            return tf.identity(t), gradient

        return identity(x)


@pytest.mark.parametrize("form", list(_GRADIENT_FORMS))
def test_a_gradient_chosen_by_the_user_s_function_is_refused_whatever_runs_it(form):
    # Between 89fd960 and now, the gradient function's own code was read: TF's functions
    # (cumsum and reverse over the batch) and wrappers the walk did not open passed, and one
    # example moved the clipped sum by 3.0-6.1x the bound (probe A2, F1).
    model = make_private(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(6), _ReturnsAGradientOf(form),
        keras.layers.Dense(3)]), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    before = [w.copy() for w in model.get_weights()]
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    with pytest.raises(UnsupportedLayerError, match=r"defines its own gradient"):
        model.fit(x, np.zeros((8, 3), np.float32), batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
