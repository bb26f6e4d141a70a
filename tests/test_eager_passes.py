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
"""The passes of an eager step (run_eagerly=True, DPGradients called eagerly) run as a
function traced for that step: every step's Python is checked, and what is checked is what
trains."""

import warnings

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPGradients, make_private

pytestmark = pytest.mark.filterwarnings("ignore:noise_multiplier=0")

N = 16


class _Switch(keras.layers.Layer):
    """The identity until ``on`` is set: then ``mixed(self, h)`` (a Python flag, read at call
    time, as a warm-up or a curriculum would)."""

    def __init__(self, mixed, **kwargs):
        super().__init__(**kwargs)
        self.mixed, self.on = mixed, False

    def call(self, h):
        return self.mixed(self, h) if self.on else h


def _centered(layer, h):  # batch centering: every example's output holds the batch's mean
    return h - tf.reduce_mean(h, axis=0, keepdims=True)


def _model(mixed=_centered):
    switch = _Switch(mixed)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5), switch,
                              keras.layers.Dense(3)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, switch


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N)


class _SwitchOn(keras.callbacks.Callback):
    def __init__(self, switch):
        super().__init__()
        self.switch = switch

    def on_epoch_end(self, epoch, logs=None):
        self.switch.on = True


# Before: the checks traced the first eager step only; with centering switched on after it,
# changing one example moved the clipped sum by 9.2 C (bound 2 C), between fits or by a
# callback (probe D3, F1).
@pytest.mark.parametrize("when", ["between_fits", "by_a_callback"])
def test_an_eager_fit_checks_every_step(when):
    model, switch = _model()
    x, y = _data()
    with pytest.raises(Exception, match="computed from several examples of the batch"):
        if when == "between_fits":
            model.fit(x, y, batch_size=N, verbose=0)
            switch.on = True
            model.fit(x, y, batch_size=N, verbose=0)
        else:
            model.fit(x, y, batch_size=N, epochs=2, verbose=0, callbacks=[_SwitchOn(switch)])
    assert switch.on


def test_an_eager_dp_gradients_loop_checks_every_call():
    model, switch = _model()
    x, y = _data()
    dp_gradients = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), l2_norm_clip=1.0, noise_multiplier=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp_gradients(x, y)
    switch.on = True
    with pytest.raises(Exception, match="computed from several examples of the batch"):
        dp_gradients(x, y)


class _EagerOnlyCentering(keras.layers.Layer):
    def call(self, h):  # batch centering, but only when run eagerly
        return _centered(self, h) if tf.executing_eagerly() else h


def _centering_model(run_eagerly):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5), _EagerOnlyCentering(),
                              keras.layers.Dense(3)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=run_eagerly,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# Before: the checks ran on a separate trace, where the branch was not taken, and the eager
# pass then trained the batch centering: one example moved the clipped sum 8.87 C (probe G3,
# F1). Now the traced function that was checked is the one that runs.
def test_an_eager_step_trains_what_its_checks_read():
    x, y = _data()
    weights = {}
    for run_eagerly in (False, True):
        model = _centering_model(run_eagerly)
        model.fit(x, y, batch_size=N, epochs=2, verbose=0)
        weights[run_eagerly] = model.get_weights()
    for traced, eager in zip(weights[False], weights[True]):
        np.testing.assert_allclose(eager, traced, rtol=1e-5, atol=1e-6)


def test_an_eager_step_changes_one_example_by_at_most_the_clip_norm():
    x, y = _data()
    sums = []
    for x_changed in (x, np.concatenate([x[:-1], 100.0 * np.ones((1, 5), np.float32)])):
        model = _centering_model(run_eagerly=True)
        dp_gradients = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(
            from_logits=True), l2_norm_clip=1.0, noise_multiplier=0.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            grads, _ = dp_gradients(x_changed, y)
        sums.append(np.concatenate([np.ravel(g) for g in grads]) * N)  # the clipped sum
    assert np.linalg.norm(sums[1] - sums[0]) <= 2.0 + 1e-4  # one example replaced: 2 C


class _NumpySign(keras.layers.Layer):
    def call(self, h):  # runs only on eager tensors
        return h * tf.constant(np.sign(np.asarray(h)), dtype=h.dtype)


class Subclassed(keras.Model):  # (a leading underscore is no valid name scope)
    def __init__(self, eager_only, **kwargs):
        super().__init__(**kwargs)
        self.first, self.sign, self.last = (keras.layers.Dense(5), eager_only(),
                                            keras.layers.Dense(3))

    def call(self, x):
        return self.last(self.sign(self.first(x)))


class _DotNumpy(keras.layers.Layer):
    def call(self, h):  # a tensor's .numpy(), eager only
        return h * tf.constant(np.sign(h.numpy()), dtype=h.dtype)


@pytest.mark.parametrize("eager_only", [_NumpySign, _DotNumpy])
def test_a_call_that_runs_only_eagerly_is_refused_naming_tensorflow_ops(eager_only):
    # Before: TF's "Cannot convert a symbolic tf.Tensor ... to a numpy array", no fix
    # (probe D3, F2).
    x, y = _data()
    model = Subclassed(eager_only)
    model(tf.constant(x[:4]))  # built eagerly (a functional model would trace the call)
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=True,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"(?s)runs only on eager tensors.*Fix: write that call "
                                         r"with TensorFlow ops"):
        model.fit(x, y, batch_size=N, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


@pytest.mark.keras3_suite  # TF's registry of custom gradients, whichever Keras runs the step
def test_eager_steps_keep_no_graph_of_their_checks():
    # Before: TF's registry of custom gradients kept each check trace's graphs: 11 graphs
    # (2.1 MB) a step, never freed (probe G3, F2).
    import gc  # pylint: disable=import-outside-toplevel
    from tensorflow.python.framework import func_graph  # pylint: disable=import-outside-toplevel
    model, _ = _model()
    x, y = _data()

    def graphs_after_a_fit():
        model.fit(x, y, batch_size=4, verbose=0)  # 4 eager steps
        gc.collect()
        return sum(isinstance(o, func_graph.FuncGraph) for o in gc.get_objects())

    first = graphs_after_a_fit()
    assert graphs_after_a_fit() <= first


@pytest.mark.parametrize("how", ["run_eagerly", "traced_fit", "dp_gradients"])
def test_tf_run_functions_eagerly_still_checks_the_step(how):
    # Before: under TF's debugging switch the step's tf.function ran eagerly, built no graph
    # and checked nothing: a batch centering trained, 7.95 C (probe H1, F1).
    x, y = _data()
    tf.config.run_functions_eagerly(True)
    try:
        model, switch = _model()
        switch.on = True
        if how == "traced_fit":
            model.compile(optimizer=keras.optimizers.SGD(1.0), run_eagerly=False,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        with pytest.raises(Exception, match="computed from several examples of the batch"):
            if how == "dp_gradients":
                DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                            l2_norm_clip=1.0, noise_multiplier=0.0)(x, y)
            else:
                model.fit(x, y, batch_size=N, verbose=0)
    finally:
        tf.config.run_functions_eagerly(False)


class _NoisyDropout(keras.layers.Layer):
    def call(self, h):  # TF's own random op, seeded from the graph
        return tf.nn.dropout(h, rate=0.5)


def test_random_ops_draw_anew_each_eager_step_under_a_global_seed():
    # Before: each step's graph, traced anew, seeded its random ops alike from the global
    # seed: the same dropout mask every step (probe H1, F3).
    keras.utils.set_random_seed(0)
    x, y = _data()
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8), _NoisyDropout(),
                              keras.layers.Dense(3)])
    dp_gradients = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), l2_norm_clip=100.0, noise_multiplier=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, second = (np.concatenate([np.ravel(g) for g in dp_gradients(x, y)[0]])
                         for _ in range(2))
    assert np.max(np.abs(first - second)) > 1e-3


class _OwnSeedDropout(keras.layers.Layer):
    def call(self, h):  # an op seed of its own, no global seed
        return tf.nn.dropout(h, rate=0.5, seed=5)


def _two_eager_gradients(layer):
    x, y = _data()
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8), layer,
                              keras.layers.Dense(3)])
    dp_gradients = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(
        from_logits=True), l2_norm_clip=100.0, noise_multiplier=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [np.concatenate([np.ravel(g) for g in dp_gradients(x, y)[0]]) for _ in range(2)]


def test_an_op_seed_of_its_own_draws_anew_each_eager_step_without_a_global_seed():
    # Before: without a global seed each step's graph seeded the op alike (TF's default
    # graph seed with the op's): one dropout mask every step (probe H4, F4).
    tf.random.set_seed(None)
    tf.compat.v1.set_random_seed(None)
    first, second = _two_eager_gradients(_OwnSeedDropout())
    assert np.max(np.abs(first - second)) > 1e-3


def test_two_runs_of_one_global_seed_in_one_process_draw_alike():
    # Before: each trace's seed came from one count over the process, so the second run of
    # the same seed drew other masks than the first (probe H4, F5).
    runs = []
    for _ in range(2):
        keras.utils.set_random_seed(3)
        runs.append(_two_eager_gradients(_NoisyDropout()))
    for first_run, second_run in zip(*runs):
        np.testing.assert_array_equal(first_run, second_run)
    assert np.max(np.abs(runs[0][0] - runs[0][1])) > 1e-3  # each step its own mask
