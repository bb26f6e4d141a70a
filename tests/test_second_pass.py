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
"""clipped_sum="second_pass" / "recompute" (tf_tempered/privacy/second_pass.py).

Their updates are checked against per-microbatch references on every conformance case
(tests/test_conformance_*.py); here: what "recompute" refuses, and why.
"""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
RECOMPUTE = EngineOptions(clipped_sum="recompute")


class NoisyDense(keras.layers.Layer):
    """A custom layer that draws random numbers with tf.random directly (no seed generator)."""

    def build(self, input_shape):
        self.kernel = self.add_weight(name="kernel", shape=(int(input_shape[-1]), 3))

    def call(self, inputs, training=None):
        return tf.matmul(inputs + tf.random.normal(tf.shape(inputs), stddev=0.1), self.kernel)


def _fit(model, run_eagerly=False, options=RECOMPUTE):
    make_private(model, options=options)
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0, learning_rate=0.1),
                  loss=LOSS, run_eagerly=run_eagerly)
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    y = np.arange(8) % 3
    return model.fit(x, y, batch_size=8, epochs=1, verbose=0)


@pytest.mark.parametrize("random_layer", [lambda: keras.layers.Dropout(0.5),
                                          lambda: keras.layers.GaussianNoise(0.1)])
def test_recompute_refuses_random_layers_naming_them(random_layer):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                              random_layer(), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"clipped_sum=\"recompute\".*draw random numbers: "
                                         r"\w+ \((Dropout|GaussianNoise)\).*second_pass"):
        make_private(model, options=RECOMPUTE)
    # The other modes take them (a forward pass run once).
    _fit(model, options=EngineOptions(clipped_sum="second_pass"))


def test_recompute_takes_dropout_of_rate_zero():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), keras.layers.Dropout(0.0),
                              keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]
    _fit(model)
    assert all(np.any(a != b) for a, b in zip(model.get_weights(), before))


def test_recompute_takes_recurrent_cells_without_dropout():
    # Keras 3's cells hold a seed generator even without dropout: they draw nothing.
    quiet = keras.Sequential([keras.Input((3, 2)), keras.layers.LSTM(2),
                              keras.layers.Dense(3)])
    assert keras_bridge.random_layers(quiet) == []
    noisy = keras.Sequential([keras.Input((3, 2)), keras.layers.GRU(2, dropout=0.1),
                              keras.layers.Dense(3)])
    names = [type(layer).__name__ for layer in keras_bridge.random_layers(noisy)]
    assert names and all(name in ("GRU", "GRUCell") for name in names)  # tf-keras: both


def test_recompute_refuses_random_ops_of_custom_layers_when_traced():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), NoisyDense()])
    with pytest.raises(ValueError, match=r"forward pass draws random numbers: .*Random"):
        _fit(model)


def _clock_seed():
    return tf.stack([tf.cast(tf.timestamp() * 1e6, tf.int64), tf.constant(0, tf.int64)])


class _StatelessNoise(keras.layers.Layer):
    """A weightless layer drawing by a stateless op seeded anew each run (from the clock)."""

    def __init__(self, draw, **kwargs):
        super().__init__(**kwargs)
        self.draw = draw

    def call(self, inputs):
        if self.draw == "truncated_normal":
            return inputs + tf.random.stateless_truncated_normal(tf.shape(inputs), _clock_seed())
        picked = tf.random.stateless_categorical(tf.zeros((tf.shape(inputs)[0], 4)), 1,
                                                 _clock_seed())
        return inputs * tf.one_hot(picked[:, 0], 4)


@pytest.mark.parametrize("draw", ["truncated_normal", "categorical"])
def test_recompute_refuses_stateless_draws_of_every_kind(draw):
    # Before: only stateless ops named "...Random..." were seen; a truncated normal or a
    # categorical drew anew in the second forward pass, and one example moved the update
    # by 1773-5456x the clip norm (probe S, F1).
    model = keras.Sequential([keras.Input((4,)), _StatelessNoise(draw), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"forward pass draws random numbers: .*Stateless"):
        _fit(model)


def test_recompute_runs_an_eager_step_as_traced():
    # Before: refused ("needs a traced training step"): an eager step read no ops. It runs
    # its passes as a traced function now, so the forward pass's draws are read there too.
    with pytest.raises(ValueError, match=r"forward pass draws random numbers: .*Random"):
        _fit(keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), NoisyDense()]),
             run_eagerly=True)
    weights = {}
    for run_eagerly in (False, True):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                  keras.layers.Dense(3)])
        _fit(model, run_eagerly=run_eagerly)
        weights[run_eagerly] = model.get_weights()
    for traced, eager in zip(weights[False], weights[True]):
        np.testing.assert_allclose(eager, traced, rtol=1e-5, atol=1e-6)


class _SecondCallScaled(keras.layers.Layer):
    """The identity on odd calls, x100 on even ones (a Python counter: each step traces the
    layer twice under recompute)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.calls = 0

    def call(self, h):
        self.calls += 1
        return h * 100.0 if self.calls % 2 == 0 else h


# Before: the second forward pass was never compared with the first: x100 on it made the
# clipped sum 599.6 against at most 16 (no clipping), one example moving it 152 C (probe H1,
# F2); traced or eager.
@pytest.mark.parametrize("run_eagerly", [False, True])
def test_recompute_refuses_a_second_pass_that_computes_other_losses(run_eagerly):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), _SecondCallScaled(),
                              keras.layers.Dense(3)])
    before = None
    with pytest.raises(tf.errors.InvalidArgumentError, match="losses differ from the first.*Fix: make each call"):
        make_private(model, options=RECOMPUTE)
        before = [w.copy() for w in model.get_weights()]
        _fit(model, run_eagerly=run_eagerly)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_recompute_takes_a_non_finite_example_as_second_pass_does():
    # Before (this stop's first check): NaN in both passes was "not the same": refused.
    x = np.random.default_rng(0).normal(size=(8, 4)).astype("float32")
    x[5, 2] = np.nan
    weights = {}
    for mode in ("second_pass", "recompute"):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                                  keras.layers.Dense(3)])
        make_private(model, options=EngineOptions(clipped_sum=mode))
        model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                          learning_rate=0.1), loss=LOSS)
        history = model.fit(x, np.arange(8) % 3, batch_size=8, verbose=0).history
        assert history["dp_nonfinite"] == [1.0]
        weights[mode] = model.get_weights()
    for a, b in zip(weights["second_pass"], weights["recompute"]):
        np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-7)


def test_recompute_trains_a_deterministic_model():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="tanh"),
                              keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]
    history = _fit(model).history
    assert history["dp_clipped_fraction"][0] >= 0
    assert all(np.any(a != b) for a, b in zip(model.get_weights(), before))
