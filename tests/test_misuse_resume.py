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
"""Misuse tests, runs killed and resumed with ``keras.callbacks.BackupAndRestore``.

The resumed run continues from weights that every step of the killed run trained, so
its ε counts them (the steps redone after the last backup too), read from the ledger
file the private fit keeps next to the backup. Every ε is checked against an
independent dp_accounting computation of the steps taken.
"""

import dp_accounting
import numpy as np
import pytest

from tf_tempered._compat import keras
from tf_tempered.callbacks import PrivacyBudget
from tf_tempered.privacy import epsilon_spent, make_private
from tf_tempered.privacy.ledger_file import LEDGER_FILE_NAME

N, BATCH, SIGMA, DELTA = 64, 16, 1.3, 1e-5
STEPS = N // BATCH  # steps an epoch
KILL_EPOCH, KILL_BATCH = 2, 2  # the killed run dies after batch 2 of epoch 2


def _data():
    rng = np.random.default_rng(0)
    return rng.normal(size=(N, 5)).astype(np.float32), rng.integers(0, 3, N)


def _model(steps_per_execution=1, **make_private_kwargs):
    model = make_private(keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=SIGMA, **make_private_kwargs)
    model.compile(optimizer=keras.optimizers.SGD(0.1), steps_per_execution=steps_per_execution,
                  loss="sparse_categorical_crossentropy")
    return model


def _rdp(*events):
    accountant = dp_accounting.rdp.RdpAccountant()
    return accountant.compose(dp_accounting.ComposedDpEvent(list(events))).get_epsilon(DELTA)


def _poisson(steps):
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(BATCH / N, dp_accounting.GaussianDpEvent(SIGMA)),
        steps)


class _Kill(keras.callbacks.Callback):
    """Raises after batch KILL_BATCH of epoch KILL_EPOCH (the process 'dies')."""

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch == KILL_EPOCH and batch >= KILL_BATCH:
            raise KeyboardInterrupt("killed")


def _killed_then_resumed(backup_dir, *, epochs=4, extra_callbacks=(), same_model=False,
                         **model_kwargs):
    """(killed model, resumed model, resumed fit's History)."""
    x, y = _data()
    killed = _model(**model_kwargs)
    with pytest.raises(KeyboardInterrupt):
        killed.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0,
                   callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir)), _Kill(),
                              *extra_callbacks])
    resumed = killed if same_model else _model(**model_kwargs)  # a new process: a new model
    history = resumed.fit(x, y, batch_size=BATCH, epochs=epochs, verbose=0,
                          callbacks=[*extra_callbacks,
                                     keras.callbacks.BackupAndRestore(str(backup_dir))])
    return killed, resumed, history


# The killed run: KILL_EPOCH epochs and KILL_BATCH + 1 steps; the resumed run redoes
# epoch KILL_EPOCH and the rest.
KILLED_STEPS = KILL_EPOCH * STEPS + KILL_BATCH + 1
RESUMED_STEPS = (4 - KILL_EPOCH) * STEPS


def test_resumed_run_counts_the_killed_runs_steps(tmp_path):
    killed, resumed, history = _killed_then_resumed(tmp_path / "backup")
    assert epsilon_spent(killed)[0] == pytest.approx(_rdp(_poisson(KILLED_STEPS)), rel=1e-9)
    assert history.epoch == [KILL_EPOCH, 3]  # it did resume
    expected = _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS))
    assert epsilon_spent(resumed)[0] == pytest.approx(expected, rel=1e-9)
    assert history.history["epsilon"][-1] == pytest.approx(expected, rel=1e-9)
    # Before the fix the resumed model reported the ε of its own RESUMED_STEPS only.
    assert expected > _rdp(_poisson(4 * STEPS))
    # The backup and its ledger file are gone once the fit ends (Keras' default).
    assert not (tmp_path / "backup" / LEDGER_FILE_NAME).exists()


def test_the_same_model_resuming_counts_each_step_once(tmp_path):
    _, resumed, _ = _killed_then_resumed(tmp_path / "backup", same_model=True)
    assert epsilon_spent(resumed)[0] == pytest.approx(
        _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS)), rel=1e-9)


def test_shuffled_batches_count_the_passes_of_both_runs(tmp_path):
    _, resumed, _ = _killed_then_resumed(tmp_path / "backup", sampling="shuffle")
    # Killed: 2 passes and one begun; resumed: 2 passes.
    gaussians = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(SIGMA), 5)
    assert epsilon_spent(resumed)[0] == pytest.approx(_rdp(gaussians), rel=1e-9)


def test_steps_per_execution_never_undercounts(tmp_path):
    # Written before each call of K steps: a kill after a call's last step (this one) counts
    # at most K - 1 steps more; one before its first step, K.
    _, resumed, _ = _killed_then_resumed(tmp_path / "backup", steps_per_execution=2)
    epsilon = epsilon_spent(resumed)[0]
    assert _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS)) <= epsilon * (1 + 1e-9)
    assert epsilon <= _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS + 1)) * (1 + 1e-9)


def test_kept_backup_keeps_its_ledger_and_a_later_fit_counts_it(tmp_path):
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    assert (tmp_path / LEDGER_FILE_NAME).exists()
    again = _model()  # restores the kept backup: weights of 2 epochs, and their steps
    again.fit(x, y, batch_size=BATCH, epochs=3, verbose=0, callbacks=[
        keras.callbacks.BackupAndRestore(str(tmp_path), delete_checkpoint=False)])
    assert epsilon_spent(again)[0] == pytest.approx(_rdp(_poisson(3 * STEPS)), rel=1e-9)


def test_a_privacy_budget_ledger_is_the_only_file_counted(tmp_path):
    # PrivacyBudget(ledger=...) keeps the run's steps itself: no second file, no double count.
    budget = PrivacyBudget(target_epsilon=100.0, ledger=tmp_path / "ledger.json")
    _, resumed, _ = _killed_then_resumed(tmp_path / "backup", extra_callbacks=[budget])
    assert not (tmp_path / "backup" / LEDGER_FILE_NAME).exists()
    assert epsilon_spent(resumed)[0] == pytest.approx(
        _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS)), rel=1e-9)


@pytest.mark.skipif(keras.__version__.startswith("3"),
                    reason="Keras 3's BackupAndRestore appends its metadata on ram:// (its bug)")
def test_a_backup_on_a_remote_filesystem_keeps_its_ledger_there():
    # tf.io.gfile paths (gs:// for preemptible cloud jobs): TF's in-memory ram:// here.
    from tf_tempered._compat import tf
    backup = f"ram://backup_{np.random.default_rng().integers(1 << 30)}"
    x, y = _data()
    with pytest.raises(KeyboardInterrupt):
        _model().fit(x, y, batch_size=BATCH, epochs=4, verbose=0,
                     callbacks=[keras.callbacks.BackupAndRestore(backup), _Kill()])
    assert tf.io.gfile.exists(f"{backup}/{LEDGER_FILE_NAME}")  # there, not on local disk
    resumed = _model()
    resumed.fit(x, y, batch_size=BATCH, epochs=4, verbose=0,
                callbacks=[keras.callbacks.BackupAndRestore(backup)])
    assert epsilon_spent(resumed)[0] == pytest.approx(
        _rdp(_poisson(KILLED_STEPS + RESUMED_STEPS)), rel=1e-9)
    assert not tf.io.gfile.exists(f"{backup}/{LEDGER_FILE_NAME}")


def test_a_privacy_budget_ledger_on_a_remote_filesystem():
    # PrivacyBudget(ledger="gs://...") kept a str path mangled by pathlib ("gs:/..."), on
    # local disk; now the file is where it was asked to be (TF's ram:// here).
    from tf_tempered._compat import tf
    ledger = f"ram://budget_{np.random.default_rng().integers(1 << 30)}/ledger.json"
    x, y = _data()
    model = _model()
    model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0,
              callbacks=[PrivacyBudget(target_epsilon=100.0, ledger=ledger)])
    assert tf.io.gfile.exists(ledger)
    again = _model()  # a new process: the ledger's steps count
    again.fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
              callbacks=[PrivacyBudget(target_epsilon=100.0, ledger=ledger)])
    assert epsilon_spent(again)[0] == pytest.approx(_rdp(_poisson(3 * STEPS)), rel=1e-9)


def test_a_full_model_checkpoint_during_fit_counts_each_step_once(tmp_path):
    # A save inside fit (ModelCheckpoint's default, or model.save in a callback) booked the
    # fit's steps so far as steps outside fit, which the fit then counted again as Poisson
    # steps: ε 16.1 logged for 12 steps worth 6.2, and in every checkpoint's ledger.
    x, y = _data()
    model = _model()
    path = str(tmp_path / "epoch_{epoch}.keras")
    history = model.fit(x, y, batch_size=BATCH, epochs=3, verbose=0,
                        callbacks=[keras.callbacks.ModelCheckpoint(path)])
    expected = [_rdp(_poisson(STEPS * epoch)) for epoch in (1, 2, 3)]
    np.testing.assert_allclose(history.history["epsilon"], expected, rtol=1e-6)
    np.testing.assert_allclose(epsilon_spent(model)[0], expected[-1], rtol=1e-6)
    loaded = make_private(keras.models.load_model(str(tmp_path / "epoch_2.keras")))
    np.testing.assert_allclose(epsilon_spent(loaded)[0], expected[1], rtol=1e-6)
