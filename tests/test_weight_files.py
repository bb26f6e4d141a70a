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

import io
import warnings

import dp_accounting
import h5py
import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import NotPrivateError, epsilon_spent, make_private
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.dp_in_files import DATASET, SIDECAR_SUFFIX, read_dp

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


def _poisson_epsilon(epochs, more=None):
    """ε of ``epochs`` of Poisson steps at σ = SIGMA (and ``more`` = (σ, epochs) after)."""
    runs = [(SIGMA, epochs)] + ([more] if more else [])
    events = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        BATCH / N, dp_accounting.GaussianDpEvent(sigma)), n * STEPS) for sigma, n in runs if n]
    return dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.ComposedDpEvent(events)).get_epsilon(DELTA)


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


def _plain_model_holding_loaded_private_weights(tmp_path):
    model = _compiled(_plain_model())
    model.load_weights(_private_file(tmp_path))
    return model


def _assert_refused_then_counted(model, epochs=1, match=None):
    """A plain fit of ``model`` is refused (naming ``match``); made private, its ε counts
    ``epochs`` epochs."""
    x, y = _data()
    with pytest.raises(NotPrivateError, match=match):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    make_private(model)
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(epochs), rtol=1e-6)


def test_a_plain_fit_traced_before_load_weights_fails_after_it(tmp_path):
    # Probe P F1: the check runs while a step is traced, so a fit traced before the load
    # kept training the loaded private weights without DP (both Kerases).
    path = _private_file(tmp_path)
    x, y = _data()
    model = _plain_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy",
                  jit_compile=False)
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # traced on the plain weights
    with pytest.warns(UserWarning, match="load_weights: .* traced before .*this model's fit"):
        model.load_weights(path)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(tf.errors.InvalidArgumentError, match="load_weights"):
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
    path = _private_file(tmp_path)
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


def test_a_declined_overwrite_keeps_the_files_dp(tmp_path, monkeypatch):
    # Probe P F3: save_weights(overwrite=False) answered "n" at Keras' prompt writes nothing;
    # the hook stripped the private file's DP dict anyway (a plain model then trained it).
    path = _private_file(tmp_path)
    monkeypatch.setattr("builtins.input", lambda *args: "n")
    _plain_model().save_weights(path, overwrite=False)
    assert read_dp(path)["settings"]["noise_multiplier"] == SIGMA
    model = _compiled(_plain_model())
    model.load_weights(path)
    x, y = _data()
    with pytest.raises(NotPrivateError):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def _encoder_model(sigma):
    """A private model on an encoder Dense layer it shares; (model, encoder layer)."""
    inputs = keras.Input((5,))
    encoder = keras.layers.Dense(4)
    model = _compiled(make_private(keras.Model(inputs, keras.layers.Dense(3)(encoder(inputs))),
                                   l2_norm_clip=1.0, noise_multiplier=sigma))
    return model, encoder


def _on_encoders(*encoders):
    inputs = keras.Input((5,))
    features = [encoder(inputs) for encoder in encoders]
    if len(features) > 1:
        features = [keras.layers.Concatenate()(features)]
    return keras.Model(inputs, keras.layers.Dense(3)(features[0]))


def test_a_plain_model_on_two_private_models_weights_saves_both_ledgers(tmp_path):
    # Probe P F4: the file kept the first ledger its weights carried (ε 4.75 for a union
    # of 8.54 in the probe).
    x, y = _data()
    a, encoder_a = _encoder_model(SIGMA)
    b, encoder_b = _encoder_model(0.9)
    a.fit(x, y, batch_size=BATCH, epochs=3, verbose=0)
    b.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    union = _poisson_epsilon(3, more=(0.9, 2))
    path = str(tmp_path / f"ensemble{FORMATS[0]}")
    _on_encoders(encoder_a, encoder_b).save_weights(path)
    resumed = _compiled(make_private(_on_encoders(keras.layers.Dense(4), keras.layers.Dense(4)),
                                     l2_norm_clip=1.0, noise_multiplier=SIGMA))
    resumed.load_weights(path)
    np.testing.assert_allclose(epsilon_spent(resumed)[0], union, rtol=1e-6)
    assert union > 1.1 * max(_poisson_epsilon(3), _poisson_epsilon(0, more=(0.9, 2)))


def test_loaded_weights_beside_a_live_private_models_part_are_refused(tmp_path):
    # Probe P F5: the file's steps went into the part's ledger, and the loaded weights
    # beside it (a head) trained without DP.
    x, y = _data()
    checkpoint = _compiled(make_private(_on_encoders(keras.layers.Dense(4)), l2_norm_clip=1.0,
                                        noise_multiplier=SIGMA))
    checkpoint.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    path = str(tmp_path / f"checkpoint{FORMATS[0]}")
    checkpoint.save_weights(path)
    owner, encoder = _encoder_model(SIGMA)
    owner.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    encoder.trainable = False
    outer = _compiled(_on_encoders(encoder))
    outer.load_weights(path)
    np.testing.assert_allclose(epsilon_spent(owner)[0], _poisson_epsilon(3), rtol=1e-6)
    with pytest.raises(NotPrivateError):
        outer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def _two_layers(second="d2", units=3):
    return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4, name="d1"),
                             keras.layers.Dense(units, name=second)])


def test_a_partial_load_over_another_private_load_keeps_both_ledgers(tmp_path):
    # Probe P F8: the second file's mark replaced the first's on every weight, also on those
    # the partial load kept (ε 3.14 reported for weights worth 4.75).
    x, y = _data()
    first = _compiled(make_private(_two_layers(), l2_norm_clip=1.0, noise_multiplier=SIGMA))
    first.fit(x, y, batch_size=BATCH, epochs=3, verbose=0)
    if KERAS_MAJOR == 3:  # a mismatched second layer, skipped
        second = _two_layers(units=2)
        load = {"skip_mismatch": True}
    else:  # another name for the second layer, loaded by name
        second = _two_layers(second="other")
        load = {"by_name": True}
    second = _compiled(make_private(second, l2_norm_clip=1.0, noise_multiplier=SIGMA))
    second.fit(x, y % 2, batch_size=BATCH, epochs=1, verbose=0)
    ext = FORMATS[0]
    first.save_weights(str(tmp_path / f"first{ext}"))
    second.save_weights(str(tmp_path / f"second{ext}"))
    model = _two_layers()
    model.load_weights(str(tmp_path / f"first{ext}"))
    model.load_weights(str(tmp_path / f"second{ext}"), **load)
    np.testing.assert_array_equal(model.get_layer("d2").get_weights()[0],
                                  first.get_layer("d2").get_weights()[0])
    make_private(model)
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(4), rtol=1e-6)


def test_load_weights_of_a_whole_private_models_hdf5_save_counts_its_ledger(tmp_path):
    # Probe P F2: the DP dict of model.save("m.h5") is in its training config.
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    model.save(str(tmp_path / "model.h5"))
    resumed = _private_model()
    resumed.load_weights(str(tmp_path / "model.h5"))
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(2), rtol=1e-6)
    plain = _compiled(_plain_model())
    plain.load_weights(str(tmp_path / "model.h5"))
    with pytest.raises(NotPrivateError):
        plain.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


class _Kill(keras.callbacks.Callback):
    """Raises in the second epoch, after the first one's backup."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == 1 and batch == 2:
            raise KeyboardInterrupt("killed")


@pytest.mark.parametrize("budget_ledger", [False, True])
def test_a_plain_fit_resuming_a_private_backup_is_refused(tmp_path, budget_ledger):
    # Probe P F7: tf-keras restores a backup through tf.train.Checkpoint, and trained the
    # private run's weights in a model not made private. (Keras 3 restores through
    # load_weights, its DP dict. With a PrivacyBudget(ledger=...) the backup holds no ledger
    # file: refused on Keras 3, not seen on tf-keras.)
    if budget_ledger and KERAS_MAJOR == 2:
        pytest.skip("tf-keras: a backup whose ledger a PrivacyBudget keeps elsewhere")
    from tf_tempered.callbacks import PrivacyBudget
    x, y = _data()
    extra = [PrivacyBudget(target_epsilon=100.0, ledger=tmp_path / "ledger.json")] \
        if budget_ledger else []
    with pytest.raises(KeyboardInterrupt):
        _private_model().fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "backup")), _Kill(), *extra])
    plain = _compiled(_plain_model())
    with pytest.raises(NotPrivateError):
        plain.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))])


# Whole-model formats: a SavedModel directory ("") with tf-keras.
MODEL_FORMATS = [".keras", ".h5"] + ([""] if KERAS_MAJOR == 2 else [])


@pytest.mark.parametrize("ext", MODEL_FORMATS)
def test_a_whole_model_save_of_loaded_private_weights_keeps_their_dp(tmp_path, ext):
    # Probe P F6: the plain model's own optimizer carries no DP dict, so a whole-model save
    # lost it (warned): a model loaded from it trained the weights without DP. The file
    # keeps it now (privacy/model_files.py).
    model = _plain_model_holding_loaded_private_weights(tmp_path)
    path = str(tmp_path / f"model{ext}")
    model.save(path)
    loaded = keras.models.load_model(path)
    _assert_refused_then_counted(loaded, match=r"private model \(loaded by load_model\)")


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="tf-keras saves to a path only")
def test_a_save_to_a_file_object_warns_where_the_dp_is_lost(tmp_path):
    model = _plain_model_holding_loaded_private_weights(tmp_path)
    with pytest.warns(UserWarning, match="holds weights loaded from a private model"):
        try:
            model.save(io.BytesIO())  # a Keras 3 without file objects raises after the check
        except (ValueError, TypeError, AttributeError):
            pass


@pytest.mark.parametrize("ext", MODEL_FORMATS)
def test_a_whole_model_save_of_a_head_on_a_frozen_private_encoder_guards_the_encoder(
        tmp_path, ext):
    # The same for a plain head on a live private encoder: the loaded head trains, the
    # encoder, unfrozen, is refused.
    x, y = _data()
    _, outer = _frozen_private_encoder_with_head(x, y)
    path = str(tmp_path / f"outer{ext}")
    outer.save(path)
    loaded = keras.models.load_model(path)
    loaded.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    head = loaded.layers[-1].get_weights()[0].copy()
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert not np.allclose(head, loaded.layers[-1].get_weights()[0])
    for layer in (loaded.layers[0], *loaded.layers[0].layers):  # (Keras 3 loads each frozen)
        layer.trainable = True
    assert len(loaded.trainable_weights) == 4
    loaded.compile(optimizer=keras.optimizers.SGD(0.1), loss="sparse_categorical_crossentropy")
    with pytest.raises(NotPrivateError):
        loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def test_a_plain_head_on_a_private_encoder_resumes_and_only_the_encoder_is_guarded(tmp_path):
    # Probe P F13: its own checkpoint marked every weight as a private model's, so the
    # resumed plain head (trained without DP in the first process, as allowed) was refused.
    def encoder():
        return keras.Sequential([keras.Input((5,)), keras.layers.Dense(4)], name="encoder")

    def on(encoder_model):
        return keras.Sequential([keras.Input((5,)), encoder_model, keras.layers.Dense(3)])

    x, y = _data()
    first = encoder()
    owner = _compiled(make_private(on(first), l2_norm_clip=1.0, noise_multiplier=SIGMA))
    owner.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    first.trainable = False
    path = str(tmp_path / f"head{FORMATS[0]}")
    _compiled(on(first)).fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(path, save_weights_only=True)])
    second = encoder()
    second.trainable = False
    resumed = _compiled(on(second))
    resumed.load_weights(path)
    resumed.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # the plain head trains
    second.trainable = True  # the encoder's weights are the private model's
    with pytest.raises(NotPrivateError):
        _compiled(resumed).fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    make_private(resumed)
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(1), rtol=1e-6)


def _frozen_private_encoder_with_head(x, y):
    """A private model's encoder (trained 1 epoch, then frozen) under a plain head, trained."""
    encoder = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5)], name="encoder")
    owner = _compiled(make_private(keras.Sequential([keras.Input((5,)), encoder,
                                                     keras.layers.Dense(3)]),
                                   l2_norm_clip=1.0, noise_multiplier=SIGMA))
    owner.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    encoder.trainable = False
    outer = _compiled(keras.Sequential([keras.Input((5,)), encoder, keras.layers.Dense(5)]))
    outer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    return encoder, outer


def test_private_positions_apply_only_to_the_same_layers_loaded_in_order(tmp_path):
    # Probe Q Q1: a model of the same weight shapes with its layers in another order (or a
    # load by name) got the saved positions, so the private encoder's weights went unmarked.
    from tf_tempered.privacy.loaded_marks import is_loaded_weight
    x, y = _data()
    encoder, outer = _frozen_private_encoder_with_head(x, y)
    path = str(tmp_path / f"outer{FORMATS[0]}")
    outer.save_weights(path)
    other = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5)], name="encoder")
    reordered = _compiled(keras.Sequential([keras.Input((5,)), keras.layers.Dense(5), other]))
    reordered.load_weights(path)
    private = encoder.get_weights()
    holding = [w for w in reordered.weights
               if any(v.shape == w.shape and np.array_equal(v, w.numpy()) for v in private)]
    assert len(holding) == 2 and all(is_loaded_weight(w) for w in holding)
    with pytest.raises(NotPrivateError):
        reordered.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


def test_reloading_its_own_checkpoint_keeps_training_the_plain_head(tmp_path):
    # Probe Q Q4: the load failed the head's traced update too (InvalidArgumentError).
    x, y = _data()
    _, outer = _frozen_private_encoder_with_head(x, y)
    path = str(tmp_path / f"outer{FORMATS[0]}")
    outer.save_weights(path)
    outer.load_weights(path)
    head = outer.layers[-1].get_weights()[0].copy()
    outer.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    assert not np.allclose(head, outer.layers[-1].get_weights()[0])


def test_a_swapped_copy_of_loaded_private_weights_is_refused_and_counts_them(tmp_path):
    # Probe Q Q2: tf_tempered.swap_activations dropped the loaded weights' mark.
    from tf_tempered import swap_activations
    model = _plain_model_holding_loaded_private_weights(tmp_path)
    copy = _compiled(swap_activations(model, "tanh"))
    _assert_refused_then_counted(copy, match=r"\(copied by tf_tempered\.swap_activations\)")


def test_a_swapped_copy_of_a_trained_private_model_is_refused_and_counts_it():
    # A copy of a live private model trained its weights without DP in a plain fit, where
    # save_weights + load_weights into the same copy was refused (both Kerases).
    from tf_tempered import swap_activations
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    _assert_refused_then_counted(_compiled(swap_activations(model, "tanh")),
                                 match=r"private model \(copied by tf_tempered\.swap_activations\)")


def test_a_swapped_copy_of_a_head_on_a_frozen_private_encoder_marks_the_encoder_only():
    # Probe R 7: the copy of a head holding private weights marked every weight, so its own
    # head could not train; now each copy is marked as its original is.
    from tf_tempered import swap_activations
    from tf_tempered.privacy.loaded_marks import is_loaded_weight
    x, y = _data()
    encoder, outer = _frozen_private_encoder_with_head(x, y)
    copy = _compiled(swap_activations(outer, "tanh"))
    copied_encoder, head = copy.layers[0], copy.layers[-1]
    assert [is_loaded_weight(w) for w in copied_encoder.weights] == [True, True]
    assert not any(is_loaded_weight(w) for w in head.weights)
    kernel = head.get_weights()[0].copy()
    copy.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # the head trains, plainly
    assert not np.allclose(kernel, head.get_weights()[0])
    np.testing.assert_array_equal(copied_encoder.get_weights()[0], encoder.get_weights()[0])
    for layer in (copied_encoder, *copied_encoder.layers):  # (Keras 3 keeps loaded
        layer.trainable = True                              # sublayers frozen otherwise)
    _compiled(copy)
    with pytest.raises(NotPrivateError):
        copy.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3 refuses to load into a model not built")
def test_a_checkpoint_restored_into_a_model_built_later_is_marked(tmp_path):
    # Probe Q Q3: tf-keras restores a TF checkpoint into a model without an Input when it is
    # built; nothing was marked at the load (no weights yet), and it trained without DP.
    path = str(tmp_path / "private")  # a TF checkpoint
    x, y = _data()
    private = _private_model()
    private.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    private.save_weights(path)
    model = _compiled(keras.Sequential([keras.layers.Dense(3)]))
    model.load_weights(path)
    with pytest.raises(NotPrivateError):
        model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_array_equal(model.get_weights()[0], private.get_weights()[0])
    make_private(model)
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(1), rtol=1e-6)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's .keras keeps nested optimizers")
def test_load_weights_of_a_keras_file_nesting_two_private_models_counts_both(tmp_path):
    # Probe Q Q5: the first nested optimizer's DP dict was taken.
    x, y = _data()
    a = _compiled(make_private(_plain_model(), l2_norm_clip=1.0, noise_multiplier=SIGMA))
    b = _compiled(make_private(_plain_model(), l2_norm_clip=1.0, noise_multiplier=0.9))
    a.fit(x, y, batch_size=BATCH, epochs=3, verbose=0)
    b.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    inputs = keras.Input((5,))
    _compiled(keras.Model(inputs, keras.layers.Add()([a(inputs), b(inputs)]))).save(
        tmp_path / "two.keras")
    inputs = keras.Input((5,))
    resumed = _compiled(make_private(keras.Model(inputs, keras.layers.Add()(
        [_plain_model()(inputs), _plain_model()(inputs)])), l2_norm_clip=1.0,
        noise_multiplier=SIGMA))
    resumed.load_weights(tmp_path / "two.keras")
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(3, more=(0.9, 2)),
                               rtol=1e-6)


def _killed_plain_fit_holding_a_frozen_private_encoder(x, y, backup):
    """The encoder of :func:`_frozen_private_encoder_with_head` under a plain head, whose fit
    with a BackupAndRestore is killed in its second epoch; the encoder."""
    encoder, outer = _frozen_private_encoder_with_head(x, y)
    with pytest.raises(KeyboardInterrupt):
        outer.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup), _Kill()])
    return encoder


def _encoder_under_a_head(trainable):
    encoder = keras.Sequential([keras.Input((5,)), keras.layers.Dense(5)], name="encoder")
    encoder.trainable = trainable
    return encoder, keras.Sequential([keras.Input((5,)), encoder, keras.layers.Dense(5)])


def test_a_plain_fits_backup_of_a_frozen_private_encoder_restores_it_guarded(tmp_path):
    # Probe Q Q6 (tf-keras): a BackupAndRestore restores through tf.train.Checkpoint, so a
    # plain model's backup holding a private model's frozen encoder came back unmarked, and
    # unfrozen the encoder trained without DP. (Keras 3: its backup is a weights file.)
    from tf_tempered.privacy.plain_backups import WEIGHTS_DP_FILE_NAME
    x, y = _data()
    backup = str(tmp_path / "backup")
    private = _killed_plain_fit_holding_a_frozen_private_encoder(x, y, backup)
    encoder, outer = _encoder_under_a_head(trainable=False)
    resumed = _compiled(outer)
    resumed.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(backup)])  # the plain head trains
    np.testing.assert_array_equal(encoder.get_weights()[0], private.get_weights()[0])
    assert not tf.io.gfile.exists(f"{backup}/{WEIGHTS_DP_FILE_NAME}")  # deleted with it
    encoder.trainable = True
    # (tf-keras' next fit needs a BackupAndRestore; Keras 3 keeps the restored epoch, 3)
    how = "restored by BackupAndRestore" if KERAS_MAJOR == 2 else "loaded by load_weights"
    with pytest.raises(NotPrivateError, match=rf"private model \({how}\)"):
        _compiled(resumed).fit(x, y, batch_size=BATCH, epochs=4, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(str(tmp_path / "next"))])
    make_private(resumed)
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(1), rtol=1e-6)


def test_a_private_model_resuming_a_plain_fits_backup_counts_its_private_weights(tmp_path):
    # The same backup resumed by a private model: its ε counts the encoder's steps.
    x, y = _data()
    backup = str(tmp_path / "backup")
    _killed_plain_fit_holding_a_frozen_private_encoder(x, y, backup)
    _, outer = _encoder_under_a_head(trainable=True)
    resumed = _compiled(make_private(outer, l2_norm_clip=1.0, noise_multiplier=SIGMA))
    resumed.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(backup)])  # epochs 2 and 3 (the first was backed up)
    np.testing.assert_allclose(epsilon_spent(resumed)[0], _poisson_epsilon(3), rtol=1e-6)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="tf-keras' load_weights of a SavedModel")
@pytest.mark.parametrize("inner", [False, True])
def test_load_weights_of_a_private_models_saved_model_counts_its_ledger(tmp_path, inner):
    # Probe P F2b: load_weights of a SavedModel directory (or its variables/variables
    # checkpoint) carried nothing: a plain model trained the weights without DP.
    x, y = _data()
    owner = _private_model()
    owner.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    directory = str(tmp_path / "saved_model")
    owner.save(directory)
    path = f"{directory}/variables/variables" if inner else directory
    plain = _compiled(_plain_model())
    plain.load_weights(path)
    with pytest.raises(NotPrivateError):
        plain.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    make_private(plain)
    np.testing.assert_allclose(epsilon_spent(plain)[0], _poisson_epsilon(2), rtol=1e-6)
    private = _private_model()
    private.load_weights(path)
    np.testing.assert_allclose(epsilon_spent(private)[0], _poisson_epsilon(2), rtol=1e-6)


@pytest.mark.parametrize("ext", MODEL_FORMATS)
def test_a_private_models_save_loaded_with_compile_false_keeps_its_dp(tmp_path, ext):
    # Probe R 1: loaded without its optimizer, compiled anew, the weights trained without
    # DP, and make_private counted ε from 0.
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    path = str(tmp_path / f"private{ext}")
    model.save(path)
    loaded = _compiled(keras.models.load_model(path, compile=False))
    with pytest.raises(NotPrivateError):
        loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    loaded = _compiled(make_private(keras.models.load_model(path, compile=False)))
    loaded.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    np.testing.assert_allclose(epsilon_spent(loaded)[0], _poisson_epsilon(3), rtol=1e-6)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="tf-keras' SavedModel")
def test_load_weights_of_a_saved_models_checkpoint_reads_the_dp_it_keeps(tmp_path):
    # Probe R 2: the DP dict in the directory was looked for beside variables/variables.
    directory = str(tmp_path / "saved_model")
    _plain_model_holding_loaded_private_weights(tmp_path).save(directory)
    plain = _compiled(_plain_model())
    plain.load_weights(f"{directory}/variables/variables")
    with pytest.raises(NotPrivateError):
        plain.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)
    make_private(plain)
    np.testing.assert_allclose(epsilon_spent(plain)[0], _poisson_epsilon(1), rtol=1e-6)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's zipped=False")
def test_an_unzipped_keras_save_keeps_the_dp(tmp_path):
    # Probe R 3: a local directory only warned, and the loaded weights trained without DP.
    directory = str(tmp_path / "unzipped")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r"(?s).*\bDP\b", UserWarning)
        _plain_model_holding_loaded_private_weights(tmp_path).save(directory, zipped=False)
    loaded = _compiled(keras.models.load_model(directory))
    with pytest.raises(NotPrivateError):
        loaded.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="tf-keras' SavedModel")
def test_a_plain_save_into_a_saved_model_directory_removes_the_stale_dp(tmp_path):
    # Probe R 6: an earlier private save's file stayed, and marked the plain model's weights.
    from tf_tempered.privacy.dp_in_files import ENTRY
    directory = str(tmp_path / "saved_model")
    _plain_model_holding_loaded_private_weights(tmp_path).save(directory)
    assert tf.io.gfile.exists(f"{directory}/{ENTRY}")
    _compiled(_plain_model()).save(directory)
    assert not tf.io.gfile.exists(f"{directory}/{ENTRY}")
    loaded = keras.models.load_model(directory)
    loaded.fit(*_data(), batch_size=BATCH, epochs=1, verbose=0)  # trains: nothing private


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="tf-keras restores a backup by tf.train.Checkpoint")
def test_a_backup_of_a_model_built_in_its_fit_guards_only_the_private_weights(tmp_path):
    # Probe R 4: a model without Input is built in fit, after BackupAndRestore began: the DP
    # dict written then said nothing of which weights were private, and the restore marked
    # the plain head too (the resumed fit failed).
    from tf_tempered.privacy.loaded_marks import is_loaded_weight
    x, y = _data()
    encoder = _private_model()
    encoder.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    outer = keras.Sequential([encoder, keras.layers.Dense(3)])
    encoder.trainable = False
    _compiled(outer)
    backup = str(tmp_path / "backup")
    with pytest.raises(KeyboardInterrupt):
        outer.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
            keras.callbacks.BackupAndRestore(backup), _Kill()])
    outer.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(backup)])  # resumed: the head trains
    assert not any(is_loaded_weight(w) for w in outer.layers[-1].weights)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's legacy .h5 saver")
def test_a_keras_save_after_a_legacy_h5_save_keeps_the_dp(tmp_path):
    # Probe S 1: Keras 3's legacy .h5 save (a ModelCheckpoint("ckpt.h5") in the fit) drops
    # "optimizer" from the model's compile config in place: the later .keras held no DP
    # dict, and the loaded model trained the weights without DP.
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[
        keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt.h5"))])
    model.save(tmp_path / "final.keras")
    _assert_refused_then_counted(keras.models.load_model(tmp_path / "final.keras"), epochs=2)


def _reloaded_export(directory):
    if KERAS_MAJOR == 3:
        return keras.layers.TFSMLayer(directory, call_endpoint="serve", trainable=True)
    from tf_keras.src.export.export_lib import ReloadedLayer
    return ReloadedLayer(directory, call_endpoint="serve", trainable=True)


def test_an_export_reloaded_to_train_is_refused_and_counts_its_steps(tmp_path):
    # Probe S 2: Model.export then TFSMLayer(..., trainable=True) (tf-keras: ReloadedLayer)
    # in a plain model trained the private weights without DP; make_private counted from 0.
    x, y = _data()
    model = _private_model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    directory = str(tmp_path / "export")
    model.export(directory)
    reloaded = _compiled(keras.Sequential([keras.Input((5,)), _reloaded_export(directory)]))
    _assert_refused_then_counted(reloaded, epochs=2,
                                 match=r"\(reloaded from an export by (TFSMLayer|ReloadedLayer)\)")


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="tf-keras' .h5 loader")
def test_a_mixed_precision_private_h5_names_the_load_that_works(tmp_path):
    # Probe S 3: "Unknown optimizer: 'PrivateSGD'" named no fix (tf-keras saves the optimizer
    # inside a LossScaleOptimizer by its class name). The fix it names keeps ε.
    x, y = _data()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _private_model()
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
        path = str(tmp_path / "mixed.h5")
        model.save(path)
        with pytest.raises(ValueError, match=r"compile=False\), then make_private\(model\)"):
            keras.models.load_model(path)
        loaded = keras.models.load_model(path, compile=False)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    _assert_refused_then_counted(_compiled(loaded), epochs=2,
                                 match=r"\(loaded by load_model\)")


def test_make_private_after_load_weights_does_not_take_the_file_s_steps_for_plain_updates(
        tmp_path):
    # Before, Keras 3: load_weights restored the optimizer's count (the file's DP steps) and
    # make_private warned of "4 updates without DP" while counting them in ε (probe P, 3).
    model = _plain_model_holding_loaded_private_weights(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_private(model)
    np.testing.assert_allclose(epsilon_spent(model)[0], _poisson_epsilon(1), rtol=1e-6)



def test_plain_updates_before_a_load_stay_warned_of(tmp_path):
    # Between c6b958e and now, any load marked the count after it as the file's: plain
    # updates before it (of layers the file does not cover) went unwarned (probe A2, F3).
    path = _private_file(tmp_path)
    model = _compiled(_plain_model())
    x, y = _data()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
    model.load_weights(path)
    with pytest.warns(UserWarning, match="updates without DP"):
        make_private(model)
