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
"""Tests for tf_tempered.callbacks: PrivacyBudget and ActivationNormMonitor."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tensorflow_privacy, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, NotPrivateError, make_private
from tf_tempered.callbacks import ActivationNormMonitor, PrivacyBudget, plot_activation_norms
from tf_tempered.privacy.accounting import compute_epsilon

from budget_models import BATCH, DELTA, N
from budget_models import data as _data
from budget_models import expected as _expected
from budget_models import model as _model


def test_epsilon_in_history_from_dp_keras_optimizer():
    x, y = _data()
    model = _model(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                       learning_rate=0.1))
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=3, callbacks=[budget], verbose=0)
    expected = _expected(3, 2.0)
    assert history.history["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert budget.epsilons == history.history["epsilon"]
    assert expected[0] < expected[1] < expected[2]
    assert budget.stopped_epoch is None


@pytest.mark.tf_privacy
def test_vectorized_optimizer_microbatches_double_sensitivity():
    x, y = _data()
    model = _model(tensorflow_privacy.VectorizedDPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                                 num_microbatches=8, learning_rate=0.1))
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    # TF Privacy's own path on Keras' shuffled batches: the bound without amplification
    # (the budget's default for a model tf_tempered does not train); 16 examples in 8
    # microbatches: microbatch size 2, accounted as σ/2.
    assert history.history["epsilon"] == pytest.approx(_expected_shuffle(2, 2.0, 2), rel=1e-12)
    assert history.history["epsilon"][0] > 1.5 * _expected_shuffle(1, 2.0)[0]


# Before: a budget told a smaller batch_size (or a larger num_examples) than the fit's counted
# a pass every ⌈N/B⌉ steps, longer than the fit's epoch: fewer passes than the run made, ε
# too small, silently (a probe: 3.189 logged for 4 passes worth 4.729).
@pytest.mark.tf_privacy
@pytest.mark.parametrize("told", [dict(num_examples=N, batch_size=BATCH // 2),
                                  dict(num_examples=3 * N, batch_size=BATCH)])
def test_a_budget_whose_pass_is_longer_than_the_fit_s_epoch_is_refused(told):
    x, y = _data()
    model = _model(tensorflow_privacy.DPKerasSGDOptimizer(
        l2_norm_clip=1.0, noise_multiplier=2.0, num_microbatches=BATCH, learning_rate=0.1))
    before = [w.numpy() for w in model.trainable_weights]
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, **told)
    with pytest.raises(ValueError, match="give the fit's num_examples and batch_size"):
        model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    assert all(np.array_equal(b, w.numpy()) for b, w in zip(before, model.trainable_weights))


def test_stops_before_exceeding_target():
    x, y = _data()
    eps = _expected(3, 2.0)
    target = (eps[1] + eps[2]) / 2  # two epochs fit, three do not
    model = _model(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                       learning_rate=0.1))
    budget = PrivacyBudget(target_epsilon=target, delta=DELTA, num_examples=N,
                           batch_size=BATCH)
    with pytest.warns(UserWarning, match="stopping after epoch 2"):
        history = model.fit(x, y, batch_size=BATCH, epochs=10, callbacks=[budget], verbose=0)
    assert history.history["epsilon"] == pytest.approx(eps[:2], rel=1e-12)
    assert len(history.history["loss"]) == 2 and budget.stopped_epoch == 1
    assert max(history.history["epsilon"]) <= target


@pytest.mark.filterwarnings("ignore:fit on a pipeline tf_tempered did not build")
def test_stops_before_exceeding_target_on_a_pipeline_of_unknown_length():
    """A generator's epochs (one shuffled pass each): the look-ahead was skipped when the
    epoch length was unknown, and fit trained past the target (5.21 > 4.36, measured)."""
    x, y = _data()
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=2.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

    def batches():
        for start in range(0, N, BATCH):
            yield x[start:start + BATCH], y[start:start + BATCH]

    data = tf.data.Dataset.from_generator(batches, output_signature=(
        tf.TensorSpec((None, 4), tf.float32), tf.TensorSpec((None,), tf.int64)))
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        eps = [compute_epsilon(num_examples=N, batch_size=BATCH, noise_multiplier=2.0,
                               epochs=k, delta=1e-5, sampling="shuffle") for k in (1, 2, 3)]
    budget = PrivacyBudget(target_epsilon=(eps[1] + eps[2]) / 2)
    with pytest.warns(UserWarning, match="stopping after epoch 2"):
        history = model.fit(data, epochs=10, callbacks=[budget], verbose=0)
    assert history.history["epsilon"] == pytest.approx(eps[:2], rel=1e-9)


def test_no_step_when_one_epoch_exceeds_target():
    x, y = _data()
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0, delta=DELTA)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    budget = PrivacyBudget(target_epsilon=0.01)
    with pytest.warns(UserWarning, match="not training"):
        history = model.fit(x, y, batch_size=BATCH, epochs=3, callbacks=[budget], verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # not a single step was taken
    assert history.history["epsilon"] == [0.0] and budget.stopped_epoch == -1  # no step
    # The model trains normally afterwards.
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert not np.array_equal(model.get_weights()[0], before[0])


def test_a_model_without_dp_is_refused_whatever_the_budget_is_told():
    # Before: a plain model trained without clipping or noise while the budget logged the ε
    # of the noise_multiplier it was given (4.24, 6.33, 8.04).
    x, y = _data()
    model = _model(keras.optimizers.SGD(learning_rate=0.1))
    before = [w.copy() for w in model.get_weights()]
    budget = PrivacyBudget(target_epsilon=1000.0, delta=DELTA, num_examples=N, batch_size=BATCH,
                           noise_multiplier=1.5, sampling="shuffle", microbatch_size=1)
    with pytest.raises(NotPrivateError, match=r"nothing on this model clips and noises.*"
                       r"Fix: make_private\(model"):
        model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_clear_errors():
    x, y = _data()
    with pytest.raises(NotPrivateError, match="noise_multiplier"):
        _model(keras.optimizers.SGD()).fit(x, y, batch_size=BATCH, verbose=0, callbacks=[
            PrivacyBudget(target_epsilon=1.0, delta=DELTA, num_examples=N, batch_size=BATCH)])
    # Without the sizes too: a plain model is refused as not private first, not told to pass
    # sizes that would not make it private (probe W; test_budget_settings has the sizes').
    with pytest.raises(NotPrivateError, match="nothing on this model clips and noises"):
        _model(keras.optimizers.SGD()).fit(x, y, batch_size=BATCH, verbose=0, callbacks=[
            PrivacyBudget(target_epsilon=1.0, delta=DELTA, noise_multiplier=1.0)])
    with pytest.raises(ValueError, match="target_epsilon"):
        PrivacyBudget(target_epsilon=0, delta=DELTA, num_examples=N)
    with pytest.raises(ValueError, match="sampling"):
        PrivacyBudget(target_epsilon=1.0, delta=DELTA, num_examples=N, sampling="fixed")


def test_activation_norm_monitor_refuses_poisson_batches():
    # Before: their padding rows were averaged as examples (2.307 for 2.838), and the norms of
    # training data were logged without noise (probe Y).
    from tf_tempered.privacy import poisson_batches  # pylint: disable=g-import-not-at-top
    x, y = _data()
    with pytest.raises(ValueError, match=r"poisson_batches.*Fix: pass held-out inputs"):
        ActivationNormMonitor("hidden", poisson_batches(x, y, expected_batch_size=BATCH,
                                                         steps=2))


def _known_model():
    model = keras.Sequential([
        keras.Input((3,)),
        keras.layers.Dense(4, activation="tanh", name="hidden"),
        keras.layers.Dense(2, name="logits"),
    ])
    hidden = model.get_layer("hidden")
    hidden.set_weights([np.arange(12, dtype=np.float32).reshape(3, 4) / 10 - 0.5,
                        np.array([0.1, -0.2, 0.3, 0.0], np.float32)])
    return model


def _numpy_norm(weights, x):
    kernel, bias = weights
    return float(np.mean(np.linalg.norm(np.tanh(x @ kernel + bias), axis=1)))


def test_activation_norm_matches_numpy_each_epoch():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 3)).astype(np.float32), rng.integers(0, 2, size=32)
    held_out = rng.normal(size=(10, 3)).astype(np.float32)
    model = _known_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    by_name = ActivationNormMonitor("hidden", held_out)
    by_name.set_model(model)
    before = _numpy_norm(model.get_layer("hidden").get_weights(), held_out)
    assert by_name.compute() == pytest.approx(before, rel=1e-6)
    by_layer = ActivationNormMonitor(model.get_layer("hidden"),
                                     tf.data.Dataset.from_tensor_slices(
                                         (held_out, np.zeros(10))).batch(3), every=2)
    weights = []
    snapshot = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: weights.append(model.get_layer("hidden").get_weights()))
    history = model.fit(x, y, batch_size=8, epochs=4, verbose=0,
                        callbacks=[by_name, by_layer, snapshot])
    expected = [_numpy_norm(w, held_out) for w in weights]
    assert len(set(np.round(expected, 6))) == 4  # training moved the weights
    assert by_name.epochs == [1, 2, 3, 4]
    assert by_name.history == pytest.approx(expected, rel=1e-6)
    assert history.history["activation_norm/hidden"][:4] == pytest.approx(expected, rel=1e-6)
    assert by_layer.epochs == [2, 4]
    assert by_layer.history == pytest.approx(expected[1::2], rel=1e-6)


def test_activation_norm_plot_writes_png(tmp_path):
    held_out = np.ones((5, 3), np.float32)
    model = _known_model()
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    auto = tmp_path / "auto.png"
    monitor = ActivationNormMonitor("hidden", held_out, plot_path=str(auto))
    model.fit(np.ones((8, 3)), np.ones((8, 2)), epochs=2, verbose=0, callbacks=[monitor])
    for path in (auto, monitor.plot(str(tmp_path / "explicit.png")),
                 plot_activation_norms({"a": monitor, "b": monitor}, tmp_path / "both.png")):
        data = open(path, "rb").read()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_activation_norm_errors():
    with pytest.raises(ValueError, match="every"):
        ActivationNormMonitor("hidden", np.ones((2, 3)), every=0)
    monitor = ActivationNormMonitor("hidden", np.ones((2, 3)))
    with pytest.raises(ValueError, match="path"):
        monitor.plot()


def _expected_shuffle(epochs, sigma, microbatch_size=1):
    """The bound for shuffled batches (no amplification): one Gaussian per epoch."""
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        return [compute_epsilon(num_examples=N, batch_size=BATCH, noise_multiplier=sigma,
                                epochs=k, delta=DELTA, sampling="shuffle",
                                microbatch_size=microbatch_size) for k in range(1, epochs + 1)]


def test_microbatches_of_our_optimizer_are_accounted():
    x, y = _data()
    model = _model(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                       num_microbatches=8, learning_rate=0.1))
    # Microbatches need fixed-size batches: not Poisson ones.
    with pytest.raises(ValueError, match="num_microbatches=8.*sampling=\"shuffle\""):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    make_private(model, sampling="shuffle")
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    # Shuffled batches: the bound without amplification; 16 examples in 8 microbatches,
    # microbatch size 2, accounted as σ/2.
    assert history.history["epsilon"] == pytest.approx(_expected_shuffle(2, 2.0, 2), rel=1e-12)
    assert history.history["epsilon"][0] > 1.5 * _expected_shuffle(1, 2.0)[0]


def test_settings_given_to_make_private_are_accounted():
    from tf_tempered.privacy.settings import model_dp_config  # pylint: disable=g-import-not-at-top
    x, y = _data()
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    plain.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert model_dp_config(plain) is None
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=2.0, num_microbatches=8,
                         sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    config = model_dp_config(model)
    assert (config.l2_norm_clip, config.noise_multiplier, config.num_microbatches) == (
        1.0, 2.0, 8)
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    # make_private's σ = 2 and 8 microbatches of 2, with a plain SGD optimizer, on
    # shuffled batches.
    assert history.history["epsilon"] == pytest.approx(_expected_shuffle(2, 2.0, 2), rel=1e-12)


def _private_dense():
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=2.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


# Before: the fit's next step failed inside Keras ("'NoneType' object is not callable").
def test_make_private_during_the_model_s_own_fit_is_refused_naming_the_fix():
    class LowerNoise(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            make_private(self.model, noise_multiplier=0.5)

    model = _private_dense()
    x, y = _data()
    with pytest.raises(RuntimeError, match=r"during its own fit.*Fix: change the settings "
                       r"between fits"):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[LowerNoise()])
    assert model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0).history["epsilon"]


# Before (Keras 3): TypeError: 'CallbackList' object is not iterable.
def test_fit_takes_a_callback_list():
    model = _private_dense()
    seen = []
    epochs = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(logs))
    x, y = _data()
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
                        callbacks=keras.callbacks.CallbackList([epochs], model=model))
    assert len(seen) == 2 and "epsilon" in seen[-1] and len(history.history["epsilon"]) == 2
