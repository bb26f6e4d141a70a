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
from tf_tempered.privacy.custom_gradients import ENGINE_SCOPE
from tf_tempered.privacy.step import random_ops, second_pass_checks

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


@pytest.mark.keras3_suite  # the engine's recompute; an eager step on Keras 2: test_eager_passes
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
# F2); traced or eager. Its extra multiply is refused while tracing now.
@pytest.mark.parametrize("run_eagerly", [False, True])
def test_recompute_refuses_a_second_pass_that_computes_other_losses(run_eagerly):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5), _SecondCallScaled(),
                              keras.layers.Dense(3)])
    make_private(model, options=RECOMPUTE)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"second pass traced other ops \(op \d+ of the first "
                                         r"pass is .*second_call_scaled.*\(Const\).*Fix: "
                                         r"make each call"):
        _fit(model, run_eagerly=run_eagerly)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


class _FrozenOnItsFirstCall(keras.layers.Layer):
    """The identity, but frozen (no gradient through it) on odd calls, or (``factor``) with a
    gradient ``factor`` times the identity's on even calls: the same values in both passes."""

    def __init__(self, factor=None, **kwargs):
        super().__init__(**kwargs)
        self.factor, self.calls = factor, 0

    def call(self, h):
        self.calls += 1
        if self.factor is None:
            return tf.stop_gradient(h) if self.calls % 2 else h
        factor = 1.0 if self.calls % 2 else self.factor
        return tf.stop_gradient(h) + factor * (h - tf.stop_gradient(h))


# Before: the losses of both passes were the same, so the values check passed, and the
# clipped sum took gradients the norms never had: 254 C (frozen first call) and 93 C
# (x100 gradient) for one example (probe H4, F1).
@pytest.mark.parametrize("factor,run_eagerly", [(None, False), (100.0, False), (None, True)])
def test_recompute_refuses_a_second_pass_with_the_same_losses_and_other_gradients(
        factor, run_eagerly):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                              _FrozenOnItsFirstCall(factor), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=r"second pass traced other ops \(op \d+ of the first "
                                         r"pass is .*(StopGradient|Const)"):
        _fit(model, run_eagerly=run_eagerly)


class _GradientScaledOnEvenCalls(keras.layers.Layer):
    """The identity in value; on even calls its gradient x100, the change made ``where``: in a
    tf.cond branch, a loop's body, a tf.function, a captured eager tensor, a variable."""

    def __init__(self, where, **kwargs):
        super().__init__(**kwargs)
        self.where, self.calls = where, 0
        self.factors = [tf.fill([200], 100.0), tf.fill([200], 1.0)]  # captured, not constants
        self.applied = tf.Variable(0.0, trainable=False)

    def build(self, input_shape):
        self.count = self.add_weight(name="count", shape=(), initializer="zeros",
                                     trainable=False)

    @tf.function
    def _scaled(self, h, factor):
        return tf.stop_gradient(h) + factor * (h - tf.stop_gradient(h))

    def call(self, h):
        self.calls += 1
        factor = 100.0 if self.calls % 2 == 0 else 1.0
        scaled = lambda v: tf.stop_gradient(v) + factor * (v - tf.stop_gradient(v))  # noqa: E731
        if self.where == "cond":
            return tf.cond(tf.constant(True), lambda: scaled(h), lambda: h)
        if self.where == "loop":
            return tf.while_loop(lambda i, v: i < 1, lambda i, v: (i + 1, scaled(v)), [0, h])[1]
        if self.where == "function":
            return self._scaled(h, factor)
        if self.where == "switch":
            return tf.switch_case(tf.constant(0), [lambda: scaled(h), lambda: h])
        if self.where == "apply":  # a write by an optimizer's op
            tf.raw_ops.ResourceApplyGradientDescent(var=self.applied.handle, alpha=1.0,
                                                    delta=tf.constant(-1.0))
            return scaled(h)
        if self.where == "capture":
            factor = tf.reduce_max(self.factors[self.calls % 2])
            return tf.stop_gradient(h) + factor * (h - tf.stop_gradient(h))
        step = self.count.assign_add(1.0)  # "variable": the factor read from a counter
        factor = 1.0 + 99.0 * tf.math.floormod(step, 2.0)
        return tf.stop_gradient(h) + factor * (h - tf.stop_gradient(h))


# Before: function bodies were not compared, captured eager tensors were matched by order and
# a counter kept in a variable gave the same ops: each trained 5.15 C (probe P1, F1); then a
# tf.switch_case's branches and an optimizer op's write were missed (P3, F2 and F3).
@pytest.mark.parametrize("where,match", [
    ("cond", r"traced other ops \(op \d+ of the first pass is .*If"),
    ("loop", r"traced other ops \(op \d+ of the first pass is .*While"),
    ("function", r"traced other ops \(op \d+ of the first pass is .*PartitionedCall"),
    ("capture", r"traced other ops \(op \d+ of the first pass is .*Max"),
    ("switch", r"traced other ops \(op \d+ of the first pass is .*Case"),
    ("variable", r"the forward pass writes variables \(.*Assign\w*VariableOp.*Fix"),
    ("apply", r"the forward pass writes variables \(.*ResourceApplyGradientDescent.*Fix")])
def test_recompute_compares_function_bodies_captures_and_refuses_writes(where, match):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                              _GradientScaledOnEvenCalls(where), keras.layers.Dense(3)])
    with pytest.raises(ValueError, match=match):
        _fit(model)


def test_recompute_values_check_refuses_other_losses_at_run_time():
    # What the ops comparison cannot see (a value read from outside the pass, e.g. a
    # variable changed between the passes): the losses themselves, compared when the step
    # runs. Equal within float tolerance and non-finite in both pass.
    first = tf.constant([1.0, float("nan"), 3.0])
    np.testing.assert_allclose(
        second_pass_checks.same_losses_as_first(first + 1e-7, first).numpy(), [1.0, np.nan, 3.0],
        rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="losses differ from the first"):
        second_pass_checks.same_losses_as_first(first * 1.01, first)


def test_recompute_ops_comparison_sees_through_the_engines_identities():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        first, second = random_ops.ForwardOps(), None
        with tf.name_scope(ENGINE_SCOPE):
            hooked = tf.identity(x)
        tf.reduce_sum(tf.nn.relu(hooked) * 2.0)
        first_ops = second_pass_checks.computation(first.new_ops())
        second = random_ops.ForwardOps()
        tf.reduce_sum(tf.nn.relu(x) * 2.0)
        second_pass_checks.same_ops_as_first(second_pass_checks.computation(second.new_ops()), first_ops)
        third = random_ops.ForwardOps()
        tf.reduce_sum(tf.nn.relu(x) * 3.0)  # another constant
        with pytest.raises(ValueError, match=r"op 1 of the first pass is .* \(Const\)"):
            second_pass_checks.same_ops_as_first(second_pass_checks.computation(third.new_ops()), first_ops)
        fourth = random_ops.ForwardOps()
        tf.reduce_sum(tf.nn.relu(2.0 * x))  # the same ops, wired otherwise
        with pytest.raises(ValueError, match="second pass traced other ops"):
            second_pass_checks.same_ops_as_first(second_pass_checks.computation(fourth.new_ops()), first_ops)


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
