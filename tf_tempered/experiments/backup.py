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
"""The train script's backup of a run (``--backup_dir``): Keras' BackupAndRestore, with the
fix named when its backup cannot be read (the privacy ledger beside it must be kept)."""

from tf_tempered._compat import keras

__all__ = ["BackupAndRestore"]


class BackupAndRestore(keras.callbacks.BackupAndRestore):
    """Keras' BackupAndRestore, with the fix named when its backup cannot be read."""

    def on_train_begin(self, logs=None):
        try:
            super().on_train_begin(logs)
        except OSError as error:  # a kill while the only backup's weights were written
            raise RuntimeError(
                f"--backup_dir={self.backup_dir}: the backup cannot be read ({error}); a run "
                "killed while it was written leaves it torn. Fix: delete the backup's weights "
                "and training metadata in that folder (Keras 3: latest.weights.h5 and "
                "training_metadata.json) but keep privacy_ledger.json, which counts the DP "
                "steps already taken (and the DP feature statistics' release): deleting the "
                "whole folder would restart ε at zero. The run then restarts from its first "
                "epoch and its ε continues from the ledger.") from error
