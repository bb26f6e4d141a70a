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
"""The train script's data preparation (tf_tempered/experiments/train_data.py).

Its batches are tested with the augmentation (tests/test_augment.py) and the ScatterNet
features (tests/test_scatternet.py).
"""

import numpy as np
import pytest

from tf_tempered import data, scatternet
from tf_tempered.experiments import common, feature_norm, train_data
from tf_tempered.scatternet import codes

pytestmark = pytest.mark.keras3_suite  # TF and NumPy data pipelines: no Keras version in it

pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")


def _config(**overrides):
    return common.validate_config(common.TrainConfig(
        dataset="digits", features="scatternet", batch_size=64, epochs=1, seed=0,
        insecure_dp_seed=5, **overrides))


def test_scatternet_features_are_mapped_and_the_release_reads_them_all(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path))
    config = _config(feature_norm="dp_stats", augmult=2, augment_shift=1)
    prepared = train_data.prepare_data(config)
    features = scatternet.scatter_dataset(data.load("digits"))  # in memory
    assert isinstance(prepared.train_x, scatternet.ShiftedFeatures)
    for mapped in (prepared.dataset.x_train, prepared.dataset.x_test):
        assert isinstance(mapped, np.memmap) and str(mapped.filename).startswith(str(tmp_path))
    np.testing.assert_array_equal(prepared.dataset.x_train, features.x_train)
    np.testing.assert_array_equal(prepared.dataset.x_test, features.x_test)
    # The same release as from the features in memory (same insecure seed: same noise).
    expected = feature_norm.release(config, features.x_train)
    np.testing.assert_array_equal(prepared.feature_stats.mean, expected.mean)
    np.testing.assert_array_equal(prepared.feature_stats.variance, expected.variance)
    assert prepared.plan.epsilon(1) > 0
    # Without augmentation copies the batches read the plain features' file: a fresh map
    # (the release read every page of the first).
    fresh = []
    real_unread = train_data._unread
    monkeypatch.setattr(train_data, "_unread", lambda x: fresh.append(real_unread(x)) or fresh[-1])
    prepared = train_data.prepare_data(_config(feature_norm="dp_stats"))
    assert prepared.train_x is prepared.dataset.x_train is fresh[0]
    assert isinstance(prepared.train_x, np.memmap)
    np.testing.assert_array_equal(prepared.train_x, features.x_train)


@pytest.mark.parametrize("fold", [None, 0])
def test_a_validation_split_holds_the_right_rows(monkeypatch, tmp_path, fold):
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path))
    prepared = train_data.prepare_data(_config(validation_size=100, validation_fold=fold,
                                               feature_norm="dp_stats", augmult=2))
    features = scatternet.scatter_dataset(data.load("digits"))
    start, stop = data.validation_block(len(features.y_train), 100, fold)
    np.testing.assert_array_equal(prepared.dataset.x_train,
                                  np.delete(features.x_train, np.s_[start:stop], axis=0))
    np.testing.assert_array_equal(prepared.validation[0], features.x_train[start:stop])
    assert len(prepared.train_x) == len(prepared.dataset.y_train) == len(features.y_train) - 100


def test_unread_maps_the_same_file_afresh(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(24, dtype=np.float32).reshape(4, 6))
    mapped = np.load(path, mmap_mode="r")
    assert float(mapped.sum()) == 276.0  # every page read
    fresh = train_data._unread(mapped)
    assert isinstance(fresh, np.memmap) and fresh is not mapped
    assert fresh.shape == (4, 6) and fresh.dtype == np.float32 and not fresh.flags.writeable
    np.testing.assert_array_equal(fresh, mapped)
    for other in (np.ones(3), mapped[1:], mapped[:2]):  # in memory; views of the map
        assert train_data._unread(other) is other


def test_batches_of_a_file_map_are_read_through_row_files(monkeypatch, tmp_path):
    """Poisson batches of a large memory-mapped array: its rows read through RowFile (pages
    released after each read), the same batches as from the array in memory."""
    from tf_tempered.experiments import privacy_plan  # pylint: disable=g-import-not-at-top
    x = np.random.default_rng(0).random((50, 2, 2, 3), dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    mapped, y = np.load(tmp_path / "x.npy", mmap_mode="r"), np.arange(50)
    config = common.validate_config(common.TrainConfig(dataset="digits", batch_size=10,
                                                       epochs=1, insecure_dp_seed=4))
    plan = privacy_plan.plan_privacy(config, 50)
    monkeypatch.setattr(train_data, "READ_PER_BATCH_BYTES", 1)
    reads = []
    real_take = train_data.RowFile.take
    monkeypatch.setattr(train_data.RowFile, "take",
                        lambda self, rows: reads.append(sorted(rows)) or real_take(self, rows))
    ref_x, ref_y, _ = next(iter(train_data.training_batches(config, plan, x, y)))
    assert reads == []  # an array in memory: indexed
    batch_x, batch_y, info = next(iter(train_data.training_batches(config, plan, mapped, y)))
    keep = info["mask"].numpy() > 0
    # The first batch's rows were read by RowFile (batches are read in parallel and ahead,
    # in any order: which read was the first batch's is not fixed).
    assert sorted(batch_y.numpy()[keep]) in reads
    np.testing.assert_array_equal(batch_y.numpy(), ref_y.numpy())
    np.testing.assert_array_equal(batch_x.numpy(), ref_x.numpy())
    np.testing.assert_array_equal(batch_x.numpy()[keep], x[batch_y.numpy()[keep]])
    assert not batch_x.numpy()[~keep].any() and (~keep).any()


def test_log8_storage_trains_on_the_codes_and_tests_on_float_features(tmp_path, monkeypatch):
    """--feature_storage=log8: the training features (statistics, validation block) are the
    unshifted variant's codes, the test features float32 computed in memory, and the cache
    holds only code files."""
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path))
    config = _config(feature_norm="dp_stats", augmult=2, augment_shift=1,
                     feature_storage="log8", validation_size=100, num_train=600, num_test=50)
    prepared = train_data.prepare_data(config)
    assert isinstance(prepared.dataset.x_train, scatternet.VariantRows)
    assert isinstance(prepared.train_x, scatternet.ShiftedFeatures)
    assert len(prepared.dataset.x_train) == len(prepared.train_x) == 500
    x_val = prepared.validation[0]
    assert isinstance(x_val, np.ndarray) and x_val.dtype == np.float32 and len(x_val) == 100
    assert set(np.unique(x_val)) <= set(codes.code_values())  # read from the codes
    x_test = prepared.dataset.x_test
    images = data.load("digits", num_train=600, num_test=50).x_test
    np.testing.assert_array_equal(x_test, scatternet.scattering_features(images, cache=False))
    names = [p.name for p in (tmp_path / "scatternet").iterdir()]
    assert len(names) == 9 and all(n.endswith("_log8.npy") for n in names)
    assert prepared.feature_stats is not None


def test_log8_storage_needs_the_shifted_scatternet_copies():
    for flags in (dict(features="scatternet"), dict(augmult=2)):
        with pytest.raises(common.ConfigError, match="--feature_storage=log8 stores"):
            common.validate_config(common.TrainConfig(dataset="digits", feature_storage="log8",
                                                      **flags))
    with pytest.raises(common.ConfigError, match="feature_storage"):
        common.validate_config(common.TrainConfig(dataset="digits", feature_storage="int4"))
