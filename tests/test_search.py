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
"""The search script: validation-only selection, tables, refusals (its axes and trials:
test_search_space.py)."""

import json

import pytest

from tf_tempered.experiments import search
from tf_tempered.experiments.common import ConfigError, TrainConfig

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

BASE = TrainConfig(dataset="digits", epochs=1, batch_size=128, learning_rate=0.5,
                   target_epsilon=3.0, validation_size=300)


def test_search_refuses_without_validation_or_target_epsilon(tmp_path):
    with pytest.raises(ConfigError, match="--validation_size must be > 0"):
        search.run_search(BASE.replace(validation_size=0), [], output_dir=str(tmp_path))
    with pytest.raises(ConfigError, match="--target_epsilon"):
        search.run_search(BASE.replace(target_epsilon=None), [], output_dir=str(tmp_path))


def test_selects_on_validation_accuracy_only_and_writes_tables(tmp_path):
    axes = [search.parse_axis("learning_rate=0.5,1"), search.parse_axis("ema_decay=none,0.9")]
    # A stand-in trainer whose test accuracy would pick another config than validation.
    fake = {(0.5, None): (0.6, 0.99), (0.5, 0.9): (0.8, 0.1),
            (1.0, None): (0.7, 0.5), (1.0, 0.9): (0.5, 0.9)}
    seen = []

    def run(config):
        seen.append(config)
        val, test = fake[(config.learning_rate, config.ema_decay)]
        return {"validation_accuracy": val, "test_accuracy": test, "test_loss": 1.0,
                "epsilon": 3.0, "delta": 1e-5, "noise_multiplier": 1.5, "steps": 10,
                "wall_time_s": 1.0, "flags": config.to_dict()}

    summary = search.run_search(BASE, axes, output_dir=str(tmp_path), verbose=0, run=run)
    assert all(c.target_epsilon == 3.0 and c.validation_size == 300 for c in seen)
    assert summary["best"]["changes"] == "learning_rate=0.5 ema_decay=0.9"
    assert summary["best"]["validation_accuracy"] == 0.8
    cmd = summary["best_command"]
    assert "--learning_rate=0.5" in cmd and "--ema_decay=0.9" in cmd \
        and "--target_epsilon=3" in cmd and "--validation_size=300" in cmd
    stored = json.loads((tmp_path / "runs" / "trial001.json").read_text())
    assert "test_accuracy" not in stored and "test_loss" not in stored
    csv = (tmp_path / "search.csv").read_text().splitlines()
    assert len(csv) == 5 and csv[0].startswith("best,trial,validation_accuracy")
    assert sum(line.startswith("*,") for line in csv) == 1
    md = (tmp_path / "search.md").read_text()
    assert "| * | trial001 | 0.8000 |" in md and "not accounted" in md
    assert "--nosave_model" not in cmd
    # Resumes without training again.
    assert search.run_search(BASE, axes, output_dir=str(tmp_path), verbose=0,
                             run=run)["num_trained"] == 0 and len(seen) == 4


def test_cross_validation_scores_the_mean_over_folds(tmp_path):
    axes = [search.parse_axis("learning_rate=0.5,1")]
    # Fold 0 alone would pick lr 0.5; the mean over three folds picks lr 1.
    fake = {(0.5, 0): 0.9, (0.5, 1): 0.5, (0.5, 2): 0.5, (1.0, 0): 0.8, (1.0, 1): 0.7,
            (1.0, 2): 0.6}
    seen = []

    def run(config):
        seen.append((config.learning_rate, config.validation_fold))
        return {"validation_accuracy": fake[seen[-1]], "test_accuracy": 1.0, "epsilon": 3.0,
                "delta": 1e-5, "noise_multiplier": 1.5, "steps": 10, "wall_time_s": 2.0}

    summary = search.run_search(BASE, axes, output_dir=str(tmp_path), folds=3, verbose=0,
                                run=run)
    assert sorted(seen) == sorted(fake)
    best = summary["best"]
    assert best["changes"] == "learning_rate=1.0" and best["trial"] == "trial001"
    assert best["validation_accuracy"] == pytest.approx(0.7)
    assert best["fold_accuracies"] == "0.8000 0.7000 0.6000" and best["wall_time_s"] == 6.0
    assert "--validation_fold" not in summary["best_command"]
    assert (tmp_path / "runs" / "trial000_fold2.json").is_file()
    assert "mean of 3 folds of 300" in (tmp_path / "search.md").read_text()
    for folds, base, match in ((0, BASE, "--validation_folds=0 is invalid"),
                               (3, BASE.replace(validation_fold=1), "drop --validation_fold")):
        with pytest.raises(ConfigError, match=match):
            search.run_search(base, axes, output_dir=str(tmp_path), folds=folds, run=run)
    with pytest.raises(ConfigError, match="cannot be searched"):
        search.parse_axis("validation_fold=0,1")


@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_a_real_tiny_search(tmp_path):
    summary = search.run_search(BASE, [search.parse_axis("learning_rate=0.5,1")],
                                output_dir=str(tmp_path), verbose=0)
    assert summary["num_trials"] == 2
    assert [r["changes"] for r in summary["rows"]] == ["learning_rate=0.5", "learning_rate=1.0"]
    for row in summary["rows"]:
        assert row["epsilon"] == pytest.approx(3.0, rel=1e-3) and row["epsilon"] <= 3.0
        assert 0 <= row["validation_accuracy"] <= 1


def test_best_command_spells_out_resolved_values_without_the_recipe():
    # learnable tempered sigmoid over --recipe=best (tanh): the activation equals the script's
    # default, so only dropping --recipe keeps the command meaning the same config.
    config = TrainConfig(dataset="mnist", recipe="best", features="scatternet",
                                activation="tempered_sigmoid", learnable=True,
                                target_epsilon=2.93)
    cmd = search.best_command(config, output_dir="runs/x")
    assert "--recipe" not in cmd and "--features=scatternet" in cmd and "--learnable" in cmd
    assert "--activation" not in cmd  # the default, which now applies
