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
"""``BackupAndRestore`` in the fit of a model that is not private.

* A backup a private model's fit wrote (its ledger file is there: :mod:`.ledger_file`)
  is refused: restored into a plain model, its weights would train without DP.
* A plain model holding private weights (a head on a frozen private encoder, or weights
  loaded from a private model's file) keeps their DP dict (:mod:`.weight_files`) in
  ``<backup_dir>/tf_tempered_weights_dp.json`` (written before each backup), and the
  restore gives it back: a plain model's weights are marked again (a plain update of the
  private ones is refused), a private model's ledger adds the steps it lacks. tf-keras only: it restores through
  ``tf.train.Checkpoint``, which carries no DP dict; Keras 3's backups are weights files,
  which carry it (``load_weights`` restores them).
"""

import json

from tf_tempered import keras_bridge
from tf_tempered._compat import KERAS_MAJOR, tf
from tf_tempered.privacy import weight_files
from tf_tempered.privacy.errors import NotPrivateError
from tf_tempered.privacy.ledger_file import LEDGER_FILE_NAME
from tf_tempered.privacy.state import get_state

__all__ = ["WEIGHTS_DP_FILE_NAME", "refuse_private_backups_in_plain_fits"]

WEIGHTS_DP_FILE_NAME = "tf_tempered_weights_dp.json"


def refuse_private_backups_in_plain_fits(backup):
    """A fit of a model that is not private, restoring a backup a private model's fit wrote
    (its ledger file is there: :mod:`.ledger_file`), would train those weights without DP
    (tf-keras restores them through tf.train.Checkpoint, which carries no DP dict)."""
    model = getattr(backup, "model", None)
    directory = _directory(backup)
    if get_state(model) is None and tf.io.gfile.exists(f"{directory}/{LEDGER_FILE_NAME}"):
        raise NotPrivateError(_PRIVATE_BACKUP.format(directory=directory))


def _directory(backup):
    return str(backup.backup_dir).rstrip("/")


def _dp_file(backup):
    return f"{_directory(backup)}/{WEIGHTS_DP_FILE_NAME}"


def _restored(backup):
    """After the restore: the weights get the backup's DP dict back (tf-keras)."""
    path = _dp_file(backup)
    if KERAS_MAJOR == 2 and tf.io.gfile.exists(path):
        with tf.io.gfile.GFile(path) as f:
            weight_files.apply_loaded_dp(backup.model, json.loads(f.read()),
                                         how="restored by BackupAndRestore")


def _backing_up(backup):
    """Before tf-keras writes a backup (the model is built by then: the dict says which of
    its weights are private): a plain model holding private weights writes their DP dict.
    (A private model's fit keeps its ledger file instead: :mod:`.ledger_file`.)"""
    model = backup.model
    dp = None if get_state(model) is not None else weight_files.dp_to_save(model)
    if dp is not None:
        path = _dp_file(backup)
        tf.io.gfile.makedirs(_directory(backup))
        with tf.io.gfile.GFile(path + ".tmp", "w") as f:
            f.write(json.dumps(dp))
        tf.io.gfile.rename(path + ".tmp", path, overwrite=True)


def _ended(backup):
    """The fit ended: its backup goes (``delete_checkpoint``, Keras' default), the DP dict too."""
    path = _dp_file(backup)
    if getattr(backup, "delete_checkpoint", True) and tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


_PRIVATE_BACKUP = (
    "BackupAndRestore({directory!r}) holds the backup of a private model's fit (its privacy "
    "ledger is there), and this model is not private: resumed, it would train those weights "
    "WITHOUT differential privacy and without counting their ε. Fix: make_private(model, "
    "l2_norm_clip=..., noise_multiplier=...) with the run's settings before fit (its ε counts "
    "the backup's steps), or a new backup_dir for a run without DP.")


keras_bridge.around_backup_restores(refuse_private_backups_in_plain_fits, _restored, _ended,
                                    _backing_up)
