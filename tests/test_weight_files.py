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
"""A private model's weights files carry its DP settings and ledger (tf_tempered.privacy.weight_files).

Resuming the Keras way — ``ModelCheckpoint(save_weights_only=True)``, then a new model,
``make_private`` and ``load_weights`` — restarted ε at 0 (probe O, stop 74: 6.70 → 4.54
after one more epoch). Every ε here is checked against dp_accounting on the steps taken.
"""

import dp_accounting
import h5py
import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import NotPrivateError, epsilon_spent, make_private
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.weight_files import DATASET, SIDECAR_SUFFIX, read_dp

N, BATCH, SIGMA, DELTA = 64, 16, 1.3, 1e-5
STEPS = N // BATCH  # Poisson steps an epoch

# The weights formats of save_weights: Keras 3 writes .weights.h5 only; tf-keras HDF5 by
# the name, else a TF checkpoint (a prefix: the ledger goes beside it).
FORMATS = [".weights.h5"] if KERAS_MAJOR == 3 else [".h5", ""]


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N)


def _plain_model():
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)])


def _compiled(model):
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    return model


def _private_model(sigma=SIGMA):
    return _compiled(make_private(_plain_model(), l2_norm_clip=1.0, noise_multiplier=sigma))


def _settings(model):
    settings = get_state(model).settings
    return settings.l2_norm_clip, settings.noise_multiplier


def _poisson_epsilon(epochs):
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(BATCH / N, dp_accounting.GaussianDpEvent(SIGMA)),
        epochs * STEPS)
    return dp_accounting.rdp.RdpAccountant().compose(event).get_epsilon(DELTA)


def _checkpointed_run(directory, ext, epochs=3):
    """A private fit saving its weights every epoch; the path of epoch e's file."""
    path = str(directory / f"epoch_{{epoch}}{ext}")
    x, y = _data()
    _private_model().fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0,
                         callbacks=[keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    return path.format


@pytest.mark.parametrize("ext", FORMATS)
def test_a_run_resumed_from_weights_counts_the_steps_they_took(tmp_path, ext):
    epoch_file = _checkpointed_run(tmp_path, ext)
    resumed = _private_model()  # a new process: a new model, make_private, load_weights
    resumed.load_weights(epoch_file(epoch=2))
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(2), rtol=1e-6)
    x, y = _data()
    history = resumed.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["epsilon"], [_poisson_epsilon(3)], rtol=1e-6)
    # Before, it reported the ε of its own epoch: the resumed run's weights took three.
    assert _poisson_epsilon(3) > 1.3 * _poisson_epsilon(1)


@pytest.mark.parametrize("ext", FORMATS)
def test_each_checkpoints_steps_count_once(tmp_path, ext):
    epoch_file = _checkpointed_run(tmp_path, ext)
    model = _private_model()
    model.load_weights(epoch_file(epoch=1))
    model.load_weights(epoch_file(epoch=3))  # the same run two epochs later: 2 more
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(3), rtol=1e-6)
    model.load_weights(epoch_file(epoch=2))  # an earlier one: nothing more
    model.load_weights(epoch_file(epoch=3))
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(3), rtol=1e-6)


def test_a_model_reloading_its_own_checkpoint_counts_nothing_more(tmp_path):
    # ModelCheckpoint(save_best_only=True), then load_weights of the best: no double count.
    path = str(tmp_path / f"best{FORMATS[0]}")
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True, monitor="loss",
                                        save_best_only=True)])
    model.load_weights(path)
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(2), rtol=1e-6)


@pytest.mark.parametrize("ext", FORMATS)
def test_a_plain_model_loading_private_weights_refuses_to_train_until_made_private(
        tmp_path, ext):
    epoch_file = _checkpointed_run(tmp_path, ext, epochs=2)
    model = _compiled(_plain_model())
    model.load_weights(epoch_file(epoch=2))
    before = [w.copy() for w in model.get_weights()]
    x, y = _data()
    with pytest.raises(NotPrivateError, match="load_weights"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)
    make_private(model)  # no arguments: the settings saved with the weights
    assert _settings(model) == (1.0, SIGMA)
    history = _compiled(model).fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_allclose(history.history["epsilon"], [_poisson_epsilon(3)], rtol=1e-6)


def _private_file(tmp_path):
    path = str(tmp_path / f"private{FORMATS[0]}")
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.save_weights(path)
    return path


def test_a_plain_fit_traced_before_load_weights_is_refused_after_it(tmp_path):
    # Probe P F1: the check runs while a step is traced, so a fit traced before the load
    # kept training the loaded private weights without DP (both Kerases).
    path = _private_file(tmp_path)
    x, y = _data()
    model = _compiled(_plain_model())
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # traced on the plain weights
    model.load_weights(path)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NotPrivateError, match="load_weights"):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    for kept, now in zip(before, model.get_weights()):
        np.testing.assert_array_equal(kept, now)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_a_tape_loop_traced_before_load_weights_fails_after_it(tmp_path, jit_compile):
    path = _private_file(tmp_path)
    x, y = _data()
    model, optimizer = _plain_model(), keras.optimizers.SGD(0.1)

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    step()
    with pytest.warns(UserWarning, match="load_weights: .* traced before .* SGD"):
        model.load_weights(path)
    if jit_compile:  # XLA has no run-time error: NaN instead of an update without DP
        step()
        assert all(np.isnan(w).all() for w in model.get_weights())
    else:
        before = [w.copy() for w in model.get_weights()]
        with pytest.raises(tf.errors.InvalidArgumentError, match="load_weights"):
            step()
        for kept, now in zip(before, model.get_weights()):
            np.testing.assert_array_equal(kept, now)


@pytest.mark.parametrize("ext", FORMATS)
def test_a_plain_models_save_carries_nothing(tmp_path, ext):
    path = str(tmp_path / f"weights{ext}")
    x, y = _data()
    private = _private_model()
    private.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    private.save_weights(path)
    assert read_dp(path)["ledger"]["segments"][0]["steps"] == STEPS
    plain = _compiled(_plain_model())
    plain.save_weights(path)  # over the private save: no stale ledger left beside it
    assert read_dp(path) is None
    assert not tf.io.gfile.exists(path + SIDECAR_SUFFIX)
    again = _compiled(_plain_model())
    again.load_weights(path)
    again.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # trains: not a private model's


def test_the_file_holds_the_ledger_and_settings_never_the_key(tmp_path):
    path = str(tmp_path / f"weights{FORMATS[0]}")
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    model.save_weights(path)
    with h5py.File(path, "r") as f:
        assert DATASET in f
    saved = read_dp(path)
    assert set(saved) == {"settings", "sampling", "augmentation_multiplicity", "options",
                          "ledger", "public_layers"}
    assert saved["settings"]["noise_multiplier"] == SIGMA


def test_weights_saved_during_a_fit_count_its_steps_so_far(tmp_path):
    # A checkpoint written by a callback mid-fit: the fit's steps are not in the ledger
    # until it ends, and are in the file.
    path = str(tmp_path / f"epoch_{{epoch}}{FORMATS[0]}")
    x, y = _data()
    _private_model().fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    saved = read_dp(path.format(epoch=1))["ledger"]["segments"]
    assert [s["steps"] for s in saved] == [STEPS]


def test_a_part_of_a_private_model_carries_its_ledger(tmp_path):
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, name="encoder_dense")(inputs)
    encoder = keras.Model(inputs, hidden)
    model = _compiled(make_private(keras.Model(inputs, keras.layers.Dense(3)(hidden)),
                                   l2_norm_clip=1.0, noise_multiplier=SIGMA))
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    path = str(tmp_path / f"encoder{FORMATS[0]}")
    encoder.save_weights(path)  # the encoder is not private itself; its weights are
    inputs = keras.Input((5,))
    new_hidden = keras.layers.Dense(4)(inputs)
    new_encoder = keras.Model(inputs, new_hidden)
    new_model = _compiled(make_private(keras.Model(inputs, keras.layers.Dense(3)(new_hidden)),
                                       l2_norm_clip=1.0, noise_multiplier=SIGMA))
    new_encoder.load_weights(path)  # into a part of a private model: its ledger counts them
    np.testing.assert_allclose(epsilon_spent(new_model)[0], _poisson_epsilon(2), rtol=1e-6)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="tf-keras' load_weights of a .keras file")
def test_load_weights_of_a_keras_file_counts_its_ledger(tmp_path):
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    model.save(tmp_path / "model.keras")
    resumed = _private_model()
    resumed.load_weights(tmp_path / "model.keras")
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(2), rtol=1e-6)
