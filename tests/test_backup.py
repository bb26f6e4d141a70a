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
"""tf_tempered/experiments/backup.py: a backup that cannot be read names the fix."""

import pytest

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.experiments import backup


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's backup file layout")
def test_a_torn_backup_names_the_files_to_delete_and_the_ledger_to_keep(tmp_path):
    # Before: a bare OSError from h5py; deleting the whole folder, the obvious fix, would
    # also delete the privacy ledger and restart ε at zero.
    (tmp_path / "latest.weights.h5").write_bytes(b"\x89HDF\r\n\x1a\n torn")
    callback = backup.BackupAndRestore(str(tmp_path))
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    callback.set_model(model)
    with pytest.raises(RuntimeError, match=r"cannot be read.*Fix: delete the backup's weights "
                       r"and training metadata.*keep privacy_ledger.json"):
        callback.on_train_begin()
