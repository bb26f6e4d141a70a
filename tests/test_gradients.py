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
"""DPGradients (tf_tempered/privacy/gradients.py): the DP gradient for custom training loops.

Same update as fit, noise of the right scale, the model's noise key and ledger, and the
per-example reference (dp_reference.py) for any Keras loss.
"""

import warnings

import dp_accounting
import numpy as np
import pytest

from dp_reference import assert_update, median_clip, per_example_reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import (DPGradients, NotPrivateError, UnsupportedLayerError,
                                 epsilon_spent, make_private)

ROWS = 16
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _mlp(dtype="float32"):
    return keras.Sequential([keras.Input((5,), dtype=dtype),
                             keras.layers.Dense(6, activation="tanh", dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(ROWS, 5)).astype(np.float32), rng.integers(0, 3, ROWS)


def _sce(y, p, model):
    del model
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True))


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_custom_loop_gives_the_update_fit_gives(jit_compile):
    # jit_compile (probe T F2): in a tf.function(jit_compile=True) DPGradients took the
    # native CPU ops, which XLA cannot compile (the first call failed naming no fix).
    x, y = _data()
    weights = _mlp().get_weights()
    norms, reference = per_example_reference(_mlp, weights, x, y, _sce)
    clip = median_clip(norms)

    loop_model = _mlp()
    loop_model.set_weights(weights)
    dp = DPGradients(loop_model, LOSS,
                     l2_norm_clip=clip, noise_multiplier=0.0)
    optimizer = keras.optimizers.SGD(1.0)

    @tf.function(jit_compile=jit_compile)
    def step(xb, yb):
        grads, logs = dp(xb, yb)
        optimizer.apply_gradients(zip(grads, loop_model.trainable_variables))
        return logs

    logs = step(x, y)
    loop_update = [a - b for a, b in zip(loop_model.get_weights(), weights)]
    assert_update(loop_update, reference(clip))
    np.testing.assert_allclose(float(logs["dp_clipped_fraction"]), np.mean(norms > clip))

    fit_model = _mlp()
    fit_model.set_weights(weights)
    make_private(fit_model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    fit_model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS)
    with pytest.warns(UserWarning, match="noise_multiplier=0"):
        fit_model.fit(x, y, batch_size=ROWS, shuffle=False, verbose=0)
    for a, b in zip(loop_model.get_weights(), fit_model.get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


def test_the_noise_has_stddev_sigma_clip_over_the_batch():
    # Zero weights for every example: the clipped sum is zero, the gradient is Z / n.
    model = keras.Sequential([keras.Input((200,)), keras.layers.Dense(50)])
    dp = DPGradients(model, LOSS, l2_norm_clip=0.5, noise_multiplier=2.0)
    x = np.ones((8, 200), np.float32)
    calls = [np.concatenate([g.numpy().ravel() for g in dp(
        x, np.zeros(8), sample_weight=np.zeros(8, np.float32))[0]]) for _ in range(16)]
    assert calls[0].size == 10050
    # n = 8 microbatches. The std estimate of 16 calls' 160 800 normals has relative standard
    # error 1/√(2·160 800) = 0.18%: 1% is 5.7 of them (one call's 10 050 and 2%, as before,
    # was 2.8: it failed about one run in 220, measured 0.33% of 300 calls).
    assert np.std(np.concatenate(calls)) * 8 == pytest.approx(2.0 * 0.5, rel=0.01)
    assert not np.allclose(calls[0], calls[1])  # fresh noise every call


def test_its_steps_are_accounted_without_amplification():
    x, y = _data()
    model = _mlp()
    dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.5, delta=1e-6)
    for _ in range(3):
        dp(x, y)
    expected = dp_accounting.rdp.RdpAccountant().compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.GaussianDpEvent(1.5), 3)).get_epsilon(1e-6)
    assert epsilon_spent(model) == (pytest.approx(expected), 1e-6)


def test_it_refuses_what_fit_refuses():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    with pytest.raises(UnsupportedLayerError, match="BatchNormalization"):
        DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)(*_data())
    with pytest.raises(ValueError, match="one value for the whole batch"):
        DPGradients(_mlp(), lambda yt, yp: tf.reduce_mean(yp), l2_norm_clip=1.0,
                    noise_multiplier=1.0)(*_data())


# Before: a call in a strategy's scope outside strategy.run failed deep in the step with
# TF's "DistributedVariable.handle is not available outside the replica context".
def test_a_call_in_a_strategy_scope_outside_strategy_run_is_refused_naming_the_fix():
    x, y = _data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model = _mlp()
        dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(ValueError, match=r"DPGradients called outside strategy\.run.*"
                                             r"Fix: call it inside the replica function"):
            dp(x, y)
        grads, _ = strategy.run(dp, args=(x, y))
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    assert len(grads) == len(model.trainable_variables)


def _gaussian_epsilon(counts, delta=1e-5):
    """RDP ε of unamplified Gaussian steps: {noise_multiplier: steps}."""
    return dp_accounting.rdp.RdpAccountant().compose(dp_accounting.ComposedDpEvent([
        dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma), steps)
        for sigma, steps in counts.items()])).get_epsilon(delta)


def test_a_loop_traced_before_make_private_is_called_again_still_counts():
    # make_private again (to re-key, or a second DPGradients on the model) draws a new key;
    # a loop traced before goes on drawing from the old one, with the σ it was traced with.
    x, y = _data()
    model = _mlp()
    dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def step(xb, yb):
        grads, _ = dp(xb, yb)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(4):
        step(x, y)
    make_private(model)  # same settings, new key
    for _ in range(12):
        step(x, y)
    assert epsilon_spent(model)[0] == pytest.approx(_gaussian_epsilon({1.0: 16}))
    DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=2.0)(x, y)  # σ 2: one step
    for _ in range(3):
        step(x, y)  # still σ 1: traced with it
    assert epsilon_spent(model)[0] == pytest.approx(_gaussian_epsilon({1.0: 19, 2.0: 1}))


@pytest.mark.parametrize("compiled_dp_optimizer", [False, True])
def test_saving_after_a_loop_keeps_its_steps_in_the_saved_ledger(tmp_path, compiled_dp_optimizer):
    x, y = _data()
    model = _mlp()
    if compiled_dp_optimizer:  # the settings live on the optimizer, not on the model
        from tf_tempered.privacy import DPKerasSGDOptimizer
        model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                    learning_rate=0.1), loss=LOSS)
        dp = DPGradients(model, LOSS, l2_norm_clip=None, noise_multiplier=None)
    else:
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
        dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
    optimizer = keras.optimizers.SGD(0.1)
    for _ in range(5):
        grads, _ = dp(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    path = str(tmp_path / "m.keras")
    model.save(path)  # before any epsilon_spent: the ledger holds none of the 5 steps yet
    loaded = make_private(keras.models.load_model(path))
    assert epsilon_spent(loaded)[0] == pytest.approx(_gaussian_epsilon({1.0: 5}))


def test_its_gradients_applied_with_the_models_own_optimizer_are_refused_naming_the_fix():
    x, y = _data()
    model = _mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
    grads, _ = dp(x, y)
    with pytest.raises(NotPrivateError, match=r"Fix: in a training loop of your own.*an "
                       r"optimizer of your own .*not model\.optimizer"):
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))


@pytest.mark.parametrize("traced", [False, True], ids=["eager", "tf.function"])
def test_raw_gradients_of_a_model_with_dp_gradients_are_refused_and_its_own_applied(traced):
    # Once a DPGradients existed for a model, any optimizer could apply any gradient to it:
    # raw tape.gradient gradients trained it without clipping or noise, with ε 0.0 reported
    # (also keras.io's GAN whose train_step applied the discriminator's raw gradients).
    x, y = _data()
    model = _mlp()
    dp = DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
    optimizer = keras.optimizers.Adam(0.01)

    def raw_step():
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                      model.trainable_variables))

    def dp_step():
        grads, _ = dp(x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    if traced:
        raw_step, dp_step = tf.function(raw_step), tf.function(dp_step)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NotPrivateError, match="a model with a DPGradients, with a gradient "
                       "DPGradients did not return.*Fix: apply the gradients"):
        raw_step()
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    dp_step()
    assert all((a != b).any() for a, b in zip(before, model.get_weights()))
    assert epsilon_spent(model)[0] > 0


def _raw_steps(models, x, y, jit_compile=False):
    """A tape step traced once for each of ``models`` (each with its own optimizer)."""
    optimizers = {id(m): keras.optimizers.SGD(0.1) for m in models}
    for m in models:
        optimizers[id(m)].build(m.trainable_variables)

    @tf.function(jit_compile=jit_compile)
    def raw_step(m):
        with tf.GradientTape() as tape:
            loss = LOSS(y, m(x, training=True))
        optimizers[id(m)].apply_gradients(zip(tape.gradient(loss, m.trainable_variables),
                                              m.trainable_variables))

    for m in models:
        raw_step(m)
    return raw_step


_TRACED_BEFORE = "a tf.function traced before it updates this model's weights with SGD"


@pytest.mark.parametrize("made_private_by", ["make_private", "DPGradients"])
def test_a_plain_step_traced_before_the_model_was_made_private_fails_instead_of_training(
        made_private_by):
    # Before: the optimizer's check runs while tracing, so a tape step traced on the plain
    # model (a notebook's loop run once, then make_private) kept applying raw gradients.
    x, y = _data()
    model, other = _mlp(), _mlp()
    raw_step = _raw_steps([model, other], x, y)
    with pytest.warns(UserWarning, match=_TRACED_BEFORE):
        if made_private_by == "make_private":
            make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
        else:
            DPGradients(model, LOSS, l2_norm_clip=1.0, noise_multiplier=1.0)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(tf.errors.InvalidArgumentError, match="traced before make_private.*"
                       "WITHOUT differential privacy.*Fix: define the training step again"):
        raw_step(model)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    others = [w.copy() for w in other.get_weights()]
    raw_step(other)  # a plain model's weights: still its plain loop's to train
    assert all((a != b).any() for a, b in zip(others, other.get_weights()))


def test_a_plain_training_function_still_exports_with_saved_model(tmp_path):
    # The flag each traced plain update reads is tracked by its optimizer: an untracked one
    # made tf.saved_model.save of a module with a training tf.function fail (probe K).
    x, y = _data()

    class Trainer(tf.Module):
        def __init__(self):
            super().__init__()
            self.model, self.optimizer = _mlp(), keras.optimizers.SGD(0.1)

        @tf.function(input_signature=[tf.TensorSpec([None, 5]), tf.TensorSpec([None], tf.int64)])
        def train(self, a, b):
            with tf.GradientTape() as tape:
                loss = LOSS(b, self.model(a, training=True))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.model.trainable_variables),
                                               self.model.trainable_variables))
            return loss

    trainer = Trainer()
    first = float(trainer.train(x, y))
    tf.saved_model.save(trainer, str(tmp_path / "trainer"))
    loaded = tf.saved_model.load(str(tmp_path / "trainer"))
    assert float(loaded.train(x, y)) < first


def _eager_sgd_step(model, x, y):
    """The weights one eager SGD(0.1) step would give a copy of ``model``."""
    twin = _mlp()
    twin.set_weights(model.get_weights())
    with tf.GradientTape() as tape:
        loss = LOSS(y, twin(x, training=True))
    keras.optimizers.SGD(0.1).apply_gradients(zip(tape.gradient(loss, twin.trainable_variables),
                                                  twin.trainable_variables))
    return twin.get_weights()


def test_a_plain_step_compiled_with_xla_before_make_private_writes_nan_instead_of_training():
    # XLA drops the assertion and raises nothing at run time: the traced update's gradients
    # carry the flag instead. Before, such a step trained the now-private weights without DP
    # (moved by 0.04-0.1 on both Kerases after make_private's warning).
    x, y = _data()
    model, other = _mlp(), _mlp()
    raw_step = _raw_steps([model, other], x, y, jit_compile=True)
    with pytest.warns(UserWarning, match=_TRACED_BEFORE + ".*jit_compile=True.*writes NaN"):
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    raw_step(model)
    assert all(np.isnan(w).all() for w in model.get_weights())
    # A plain model's weights: its compiled loop trains them, by the same update as eagerly.
    eager = _eager_sgd_step(other, x, y)
    before = [w.copy() for w in other.get_weights()]
    raw_step(other)
    for trained, expected, old in zip(other.get_weights(), eager, before):
        assert np.abs(trained - old).max() > 1e-4
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_loop_traced_with_the_models_own_optimizer_is_warned_of_and_a_fit_is_not(
        jit_compile):
    # The warning left out the model's own optimizer (make_private drops the step a fit
    # traced), so a loop applying model.optimizer, traced before make_private, got none, and
    # under XLA wrote NaN into the weights with no message (stop 75's F3). Now only a
    # fit's traced step (a Model's train_step on the stack) goes unwarned.
    x, y = _data()
    fitted, looped = _mlp(), _mlp()
    for model in (fitted, looped):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS, jit_compile=jit_compile)
    fitted.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
    fitted.train_on_batch(x, y)

    @tf.function(jit_compile=jit_compile)
    def loop_step():
        with tf.GradientTape() as tape:
            loss = LOSS(y, looped(x, training=True))
        looped.optimizer.apply_gradients(zip(tape.gradient(loss, looped.trainable_variables),
                                             looped.trainable_variables))

    loop_step()
    with pytest.warns(UserWarning, match=_TRACED_BEFORE):
        make_private(looped, l2_norm_clip=1.0, noise_multiplier=1.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_private(fitted, l2_norm_clip=1.0, noise_multiplier=1.0)
    assert not [w for w in caught if "traced before it" in str(w.message)]
    if jit_compile:
        loop_step()
        assert all(np.isnan(w).all() for w in looped.get_weights())
    else:
        with pytest.raises(tf.errors.InvalidArgumentError, match="traced before make_private"):
            loop_step()


def test_a_plain_models_xla_step_logs_no_dropped_assertion(capfd):
    # The guard's assertion is left out of XLA-compiled updates (the flag rides on the
    # gradients there): XLA would drop it, logging "Ignoring Assert operator" (TF 2.21, C++
    # log on stderr) at every compile of every plain model's jit_compile=True step.
    x, y = _data()
    model = _mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS, jit_compile=True)
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0)
    assert "Ignoring Assert" not in capfd.readouterr().err


def test_a_plain_step_traced_before_make_private_called_inside_an_xla_step_writes_nan():
    # A tf.function traced without XLA (its assertion in place) and called later inside a
    # jit_compile=True step: XLA inlines its graph and drops the assertion. Before, it trained
    # the now-private weights without DP (the raw SGD update to 3e-8, probe O).
    x, y = _data()
    model, other = _mlp(), _mlp()
    raw_step = _raw_steps([model, other], x, y)  # traced without XLA

    @tf.function(jit_compile=True)
    def compiled_step(m):
        raw_step(m)

    with pytest.warns(UserWarning, match=_TRACED_BEFORE + ".*called inside such a step"):
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    compiled_step(model)
    assert all(np.isnan(w).all() for w in model.get_weights())
    eager = _eager_sgd_step(other, x, y)
    compiled_step(other)  # a plain model's weights: trained, by the plain update
    for trained, expected in zip(other.get_weights(), eager):
        np.testing.assert_allclose(trained, expected, rtol=1e-5, atol=1e-6)


def _assert_raw_step_refused(model, raw_step, traced):
    """``raw_step`` (a plain update of ``model``'s weights), run eagerly, in a tf.function or
    traced before make_private, is refused once the model is private, no weight moved."""
    if traced != "eagerly":
        raw_step = tf.function(raw_step)
    if traced == "traced before":
        raw_step()
        with pytest.warns(UserWarning, match="traced before it"):
            make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    else:
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    before = [w.copy() for w in model.get_weights()]
    expected = (tf.errors.InvalidArgumentError if traced == "traced before" else NotPrivateError)
    with pytest.raises(expected, match="WITHOUT differential privacy"):
        raw_step()
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


@pytest.mark.parametrize("traced", ["eagerly", "in a tf.function", "traced before"])
def test_a_private_weight_given_to_the_optimizer_as_its_tf_variable_is_refused(traced):
    # Keras 3's tape.watched_variables() gives the tf.Variables that hold the model's weights,
    # and a Keras optimizer updates them: the tags were on the Keras variables only, so such
    # a loop trained a private model without DP (eagerly too; probe O, Keras 3).
    x, y = _data()
    model = _mlp()
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)

    def raw_step():
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        watched = tape.watched_variables()
        optimizer.apply_gradients(zip(tape.gradient(loss, watched), watched))

    _assert_raw_step_refused(model, raw_step, traced)


@pytest.mark.parametrize("traced", ["eagerly", "in a tf.function", "traced before"])
def test_a_tf1_optimizer_s_update_of_a_private_weight_is_refused(traced):
    # Before: tf.compat.v1.train optimizers trained a private model's weights without DP and
    # without a word (probe S, F8).
    if traced == "traced before" and KERAS_MAJOR == 3:
        pytest.skip("a traced TF 1 optimizer cannot update Keras 3's variables at all")
    x, y = _data()
    model = _mlp()
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)

    def raw_step():
        with tf.GradientTape() as tape:
            loss = LOSS(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    _assert_raw_step_refused(model, raw_step, traced)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3 compiles no TF 1 optimizer")
def test_a_private_model_compiled_with_a_tf1_optimizer_trains_by_its_dp_step():
    # tf-keras wraps it (TFOptimizer): its update is the model's own, not refused.
    x, y = _data()
    model = make_private(_mlp(), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=8, verbose=0)
    assert all((a != b).any() for a, b in zip(before, model.get_weights()))
    assert 0 < epsilon_spent(model)[0] < np.inf


def test_a_plain_step_run_by_a_strategy_before_make_private_fails_instead_of_training():
    # Before: under a tf.distribute strategy no flag was made and make_private warned of
    # nothing: the old step trained the now-private weights without DP.
    x, y = _data()
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        model, other = _mlp(), _mlp()
        optimizers = {id(m): keras.optimizers.SGD(0.1) for m in (model, other)}
        for m in (model, other):
            optimizers[id(m)].build(m.trainable_variables)

    @tf.function
    def raw_step(m):
        def replica_step():
            with tf.GradientTape() as tape:
                loss = LOSS(y, m(x, training=True))
            optimizers[id(m)].apply_gradients(zip(tape.gradient(loss, m.trainable_variables),
                                                  m.trainable_variables))
        strategy.run(replica_step)

    raw_step(model)
    raw_step(other)
    with pytest.warns(UserWarning, match=_TRACED_BEFORE):
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(tf.errors.InvalidArgumentError, match="traced before make_private"):
        raw_step(model)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    others = [w.copy() for w in other.get_weights()]
    raw_step(other)
    assert all((a != b).any() for a, b in zip(others, other.get_weights()))


def test_make_private_does_not_warn_of_its_own_fit_traced_before():
    # A plain fit's own step, which make_private drops, is not named.
    x, y = _data()
    fitted = _mlp()
    fitted.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    fitted.fit(x, y, verbose=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        make_private(fitted, l2_norm_clip=1.0, noise_multiplier=1.0)
    assert not [w for w in caught if "traced before it" in str(w.message)]


def _loss_scaled_optimizers():
    """Optimizers whose apply divides the gradients (Keras 3: a LossScaleOptimizer, and a
    ``loss_scale_factor``; tf-keras' LossScaleOptimizer does not)."""
    yield keras.mixed_precision.LossScaleOptimizer(keras.optimizers.SGD(1.0))
    if KERAS_MAJOR == 3:
        yield keras.optimizers.SGD(1.0, loss_scale_factor=128.0)
        yield keras.mixed_precision.LossScaleOptimizer(
            keras.optimizers.SGD(1.0, loss_scale_factor=4.0))


@pytest.mark.parametrize("traced", [False, True])
def test_dp_gradients_through_a_loss_scaling_optimizer_are_applied_as_returned(traced):
    """Probe T F5: Keras 3's LossScaleOptimizer (its mixed-precision loop) divided the DP
    update by its scale, 32768 (a loss_scale_factor likewise): ĝ is no scaled-loss gradient."""
    x, y = _data()
    weights = _mlp().get_weights()
    norms, reference = per_example_reference(_mlp, weights, x, y, _sce)
    clip = median_clip(norms)
    for optimizer in _loss_scaled_optimizers():
        model = _mlp()
        model.set_weights(weights)
        dp = DPGradients(model, LOSS, l2_norm_clip=clip, noise_multiplier=0.0)

        def step(xb, yb, dp=dp, model=model, optimizer=optimizer):
            grads, _ = dp(xb, yb)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

        (tf.function(step) if traced else step)(x, y)
        assert_update([a - b for a, b in zip(model.get_weights(), weights)], reference(clip))


def test_make_private_names_another_model_s_fit_traced_before_for_what_it_is():
    # The pre-training flow (a plain model's fit, its layers reused under a new head, then
    # make_private) was warned of as "a training loop run on the plain model" (probe C2).
    x, y = _data()
    pretrained = _mlp()
    pretrained.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    pretrained.fit(x, y, verbose=0)
    inputs = keras.Input(x.shape[1:])
    reused = keras.Model(inputs, keras.layers.Dense(3)(pretrained.layers[0](inputs)))
    with pytest.warns(UserWarning, match=r"another model's fit traced before it also updates "
                                         r"these weights .*Nothing to do if that model is done"):
        make_private(reused, l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(tf.errors.InvalidArgumentError, match="WITHOUT differential privacy"):
        pretrained.fit(x, y, verbose=0)
