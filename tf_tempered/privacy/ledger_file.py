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
"""A private model's ledger kept in a file, so that a killed and resumed run counts every step.

``keras.callbacks.BackupAndRestore`` restores a killed run's weights, optimizer and epoch,
not the model's privacy ledger (it lives in the optimizer's config, which
``save_weights`` does not write): without a file the resumed run would report the ε of
its own steps only, although the weights it continues from took all the earlier ones.
So a private model's ``fit`` with a BackupAndRestore keeps
``<backup_dir>/tf_tempered_privacy_ledger.json`` (:class:`BackupLedger`), written before
every train call with the steps that call is about to take — a kill between the write
and the step over-counts by at most ``steps_per_execution`` steps, never under-counts —
and read at the start of the next fit, as ``PrivacyBudget(ledger=...)``'s file is.

File: ``{"version": 2, "steps": n, "ledger": PrivacyLedger.to_config(), ...}``.
"""

import json
import os

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import ledger_lineage
from tf_tempered.privacy.ledger import PrivacyLedger, Segment
from tf_tempered.privacy.state import get_state

__all__ = ["LEDGER_FILE_NAME", "read_ledger_file", "write_ledger_file", "BackupLedger",
           "backup_ledgers"]

LEDGER_FILE_NAME = "tf_tempered_privacy_ledger.json"


def read_ledger_file(path, state, run):
    """Adds the DP steps the file at ``path`` holds to the model's ledger, once per model
    (a model that wrote the file already counts them), and returns the file's data."""
    path = str(path)
    data = json.loads(_read(path)) if tf.io.gfile.exists(path) else {}
    segments = None
    key = path if "://" in path else os.path.realpath(path)
    if isinstance(data.get("ledger"), dict) and data["ledger"].get("id"):
        if key not in state.loaded_ledgers:  # the same run's weights may have brought it
            ledger_lineage.absorb(state.ledger, data["ledger"])
    elif isinstance(data.get("ledger"), dict):  # written before ledgers carried an id
        segments = PrivacyLedger.from_config(data["ledger"]).segments
    elif isinstance(data.get("steps"), int) and data["steps"] >= 0:  # an older file
        now = run.segment()
        segments = [Segment(now.sampling, now.noise_multiplier, steps=data["steps"],
                            passes=data["steps"] and max(1, now.passes),
                            sampling_probability=now.sampling_probability)]
    elif data:
        raise ValueError(f"privacy ledger file {path} is corrupt ({data!r}); restore it or "
                         f"start a new run with a new backup directory.")
    if key not in state.loaded_ledgers and segments:
        state.ledger.segments.extend(s for s in segments if s.mechanisms)
    state.loaded_ledgers.add(key)
    return data


def _read(path):
    with tf.io.gfile.GFile(path) as f:
        return f.read()


def write_ledger_file(path, state, run, *, ahead=0, **extra):
    """Writes the model's ledger and this fit's steps (plus ``ahead`` steps about to be
    taken) to ``path``, atomically: a kill leaves the old or the new file. Returns the
    steps it counts."""
    path = str(path)
    config = state.ledger.to_config()
    if not run.finished:  # a finished fit's steps are in the model's ledger already
        config["segments"].append(dict(vars(run.segment_ahead(ahead))))
    steps = sum(s["steps"] for s in config["segments"])
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(json.dumps({"version": 2, "steps": steps, **extra, "ledger": config}))
    tf.io.gfile.rename(tmp, path, overwrite=True)
    return steps


class BackupLedger(keras.callbacks.Callback):
    """Keeps a private model's ledger next to a BackupAndRestore's backup (module docstring).

    Deleted with the backup when the fit ends and the BackupAndRestore deletes its
    checkpoint (``delete_checkpoint=True``, Keras' default).
    """

    def __init__(self, account, backup):
        super().__init__()
        self._supports_tf_logs = True  # reads no logs: Keras need not convert them per batch
        self.account = account
        # tf.io.gfile paths: a backup on gs:// (preemptible cloud jobs) keeps its ledger too.
        self.directory = str(backup.backup_dir)
        self.path = self.directory.rstrip("/") + "/" + LEDGER_FILE_NAME
        self.delete_with_backup = bool(getattr(backup, "delete_checkpoint", True))
        self.steps_per_call = 1

    def on_train_begin(self, logs=None):
        self.steps_per_call = keras_bridge.steps_per_execution(self.model)
        tf.io.gfile.makedirs(self.directory)
        read_ledger_file(self.path, get_state(self.model), self.account)

    def on_train_batch_begin(self, batch, logs=None):
        write_ledger_file(self.path, get_state(self.model), self.account,
                          ahead=self.steps_per_call)

    def on_epoch_end(self, epoch, logs=None):
        write_ledger_file(self.path, get_state(self.model), self.account)

    def on_train_end(self, logs=None):
        if self.delete_with_backup:
            if tf.io.gfile.exists(self.path):
                tf.io.gfile.remove(self.path)
        else:
            write_ledger_file(self.path, get_state(self.model), self.account)


def backup_ledgers(account, callbacks):
    """A BackupLedger for each BackupAndRestore in ``callbacks`` whose run no
    ``PrivacyBudget(ledger=...)`` already keeps in a file of its own."""
    if any(getattr(c, "keeps_ledger_file", False) for c in callbacks):
        return []
    return [BackupLedger(account, c) for c in callbacks
            if isinstance(c, keras.callbacks.BackupAndRestore)]
