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
"""--validation_size: the held-out tail of the training set, σ and ε on the rest, test once."""

import json
import pathlib

import numpy as np
import pytest

from tf_tempered import data, validation_split
from tf_tempered._compat import keras
from tf_tempered.experiments import train as train_lib
from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config
from tf_tempered.privacy.accounting import compute_epsilon, noise_multiplier_for_epsilon
from tf_tempered.privacy.sampling import poisson_steps_per_epoch

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

DIGITS_TRAIN, VAL = 1438, 300
TINY = TrainConfig(dataset="digits", epochs=1, batch_size=128, learning_rate=0.5,
                   validation_size=VAL, target_epsilon=3.0)
SHARED = pathlib.Path("/work/shared/data")


def test_data_reexports_the_split_functions():
    for name in validation_split.__all__:
        assert getattr(data, name) is getattr(validation_split, name) and name in data.__all__


def test_split_is_the_last_examples_and_keeps_the_rest():
    ds = data.load("digits")
    train, (x_val, y_val) = data.split_validation(ds, VAL)
    np.testing.assert_array_equal(train.x_train, ds.x_train[:-VAL])
    np.testing.assert_array_equal(y_val, ds.y_train[-VAL:])
    np.testing.assert_array_equal(x_val, ds.x_train[-VAL:])
    np.testing.assert_array_equal(train.y_test, ds.y_test)
    # Not class-ordered: the tail holds every class, in near-uniform proportions.
    assert np.bincount(y_val, minlength=10).min() >= 20
    for bad in (0, DIGITS_TRAIN, -5, 2.5, True):
        with pytest.raises(ValueError, match="validation_size"):
            data.split_validation(ds, bad)


def test_folds_are_blocks_from_the_start_and_cover_the_training_set():
    assert data.validation_block(60000, 5000) == (55000, 60000)  # the default: the tail
    assert [data.validation_block(60000, 12000, k) for k in range(5)] == [
        (0, 12000), (12000, 24000), (24000, 36000), (36000, 48000), (48000, 60000)]
    ds = data.load("digits")
    held_out = []
    for k in range(3):
        train, (x_val, y_val) = data.split_validation(ds, 479, fold=k)
        block = slice(479 * k, 479 * (k + 1))
        np.testing.assert_array_equal(x_val, ds.x_train[block])
        np.testing.assert_array_equal(y_val, ds.y_train[block])
        rest = np.delete(np.arange(DIGITS_TRAIN), np.arange(DIGITS_TRAIN)[block])
        np.testing.assert_array_equal(train.x_train, ds.x_train[rest])
        np.testing.assert_array_equal(train.y_train, ds.y_train[rest])
        held_out.extend(range(DIGITS_TRAIN)[block])
    assert held_out == list(range(3 * 479))  # each example held out once (1438 = 3·479 + 1)
    # The last fold's rest is a view, the middle one's a copy: the order is kept either way.
    x = np.arange(10)
    assert data.without_block(x, 0, 3).tolist() == list(range(3, 10))
    assert data.without_block(x, 4, 7).tolist() == [0, 1, 2, 3, 7, 8, 9]
    for bad in (-1, 3, 1.0, True):
        with pytest.raises(ValueError, match=r"fold=.* must be an integer in \[0, 2\]"):
            data.split_validation(ds, 479, fold=bad)


def test_validation_fold_flag_is_checked_and_trains_without_its_block():
    with pytest.raises(ConfigError, match="--validation_fold=-1 is invalid"):
        validate_config(TINY.replace(validation_fold=-1))
    with pytest.raises(ConfigError, match="--validation_fold=0 needs --validation_size"):
        validate_config(TINY.replace(validation_size=0, validation_fold=0))
    with pytest.raises(ConfigError, match="--validation_fold=3 is past the end.*"
                                          "--validation_fold=2 or less"):
        train_lib.run_training(TINY.replace(validation_size=479, validation_fold=3), verbose=0)
    metrics = train_lib.run_training(TINY.replace(validation_size=479, validation_fold=1),
                                     verbose=0)
    assert metrics["dataset"]["num_train"] == DIGITS_TRAIN - 479
    assert metrics["dataset"]["validation_fold"] == 1
    assert metrics["epsilon"] <= 3.0


@pytest.mark.skipif(not (SHARED / "mnist").is_dir(), reason="no shared MNIST files")
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_idx_training_files_are_not_class_ordered(name):
    y = data.load(name, data_dir=str(SHARED), num_test=0, allow_tfds=False).y_train
    tail = np.bincount(y[-5000:], minlength=10)
    assert tail.min() >= 400 and tail.max() <= 600  # ~500 per class


def test_bad_validation_size_is_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--validation_size=-1"):
        validate_config(TINY.replace(validation_size=-1))
    with pytest.raises(ConfigError, match=f"--validation_size={DIGITS_TRAIN} leaves no"):
        train_lib.run_training(TINY.replace(validation_size=DIGITS_TRAIN), verbose=0)
    with pytest.raises(ConfigError, match="after --validation_size=1400"):
        train_lib.run_training(TINY.replace(validation_size=1400), verbose=0)


def test_training_sigma_and_epsilon_use_the_rest_and_test_is_separate(tmp_path):
    n = DIGITS_TRAIN - VAL
    metrics = train_lib.run_training(TINY.replace(output_dir=str(tmp_path)), verbose=0)
    assert metrics["dataset"]["num_train"] == n and metrics["dataset"]["num_validation"] == VAL
    steps = poisson_steps_per_epoch(num_examples=n, expected_batch_size=128)
    sigma = noise_multiplier_for_epsilon(target_epsilon=3.0, num_examples=n, batch_size=128,
                                         steps=steps, delta=1e-5, sampling="poisson")
    assert metrics["noise_multiplier"] == pytest.approx(sigma, rel=1e-12)
    assert metrics["epsilon"] == pytest.approx(
        compute_epsilon(num_examples=n, batch_size=128, noise_multiplier=sigma, steps=steps,
                        delta=1e-5, sampling="poisson"), rel=1e-12)
    assert metrics["epsilon"] <= 3.0
    # Per-epoch evaluation is on the validation split; the test set only at the end.
    (record,) = metrics["history"]
    assert "validation_accuracy" in record and "test_accuracy" not in record
    assert record["validation_accuracy"] == pytest.approx(metrics["validation_accuracy"])
    assert json.loads((tmp_path / "metrics.json").read_text())["validation_accuracy"] == \
        pytest.approx(metrics["validation_accuracy"])

    model = keras.models.load_model(tmp_path / "model.keras", compile=False)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    ds = data.load("digits")
    _, val_acc = model.evaluate(ds.x_train[-VAL:], ds.y_train[-VAL:], verbose=0)
    _, test_acc = model.evaluate(*ds.test, verbose=0)
    assert val_acc == pytest.approx(metrics["validation_accuracy"], abs=1e-6)
    assert test_acc == pytest.approx(metrics["test_accuracy"], abs=1e-6)


def test_without_validation_the_keys_say_so():
    metrics = train_lib.run_training(TINY.replace(validation_size=0, target_epsilon=None,
                                                  dpsgd=False), verbose=0)
    assert metrics["validation_accuracy"] is None and metrics["dataset"]["num_validation"] == 0
    assert "test_accuracy" in metrics["history"][0]
