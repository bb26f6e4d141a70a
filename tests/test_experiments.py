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
"""The paper's figure scripts: sweep (Fig. 2), pareto (Fig. 3), activation_norms (Fig. 4)."""

import csv
import json
import math

import pytest

from tf_tempered.experiments import activation_norms, pareto, sweep
from tf_tempered.experiments.common import ConfigError, TrainConfig

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
BASE = TrainConfig(dataset="digits", num_train=512, num_test=128, epochs=1, batch_size=64,
                   learning_rate=0.5)


def _read(path):
    with open(path) as f:
        return json.load(f)


def _is_png(path):
    return path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_sweep_writes_summary_and_resumes_without_training(tmp_path, monkeypatch):
    calls = []
    real_run = sweep.run_training
    monkeypatch.setattr(sweep, "run_training",
                        lambda config, **kw: calls.append(config) or real_run(config, **kw))
    grid = dict(scales=[1.0, 2.0], inverse_temperatures=[2.0], offsets=[1.0, 1.0])  # a duplicate
    summary = sweep.run_sweep(BASE, output_dir=tmp_path, verbose=0, **grid)

    assert len(calls) == 2 and summary["num_trained"] == 2
    assert {(c.scale, c.inverse_temperature, c.offset) for c in calls} == {(1, 2, 1), (2, 2, 1)}
    runs = sorted((tmp_path / "runs").glob("*.json"))
    assert [p.name for p in runs] == ["s1_T2_o1.json", "s2_T2_o1.json"]
    with open(tmp_path / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 and float(rows[0]["test_accuracy"]) >= float(rows[1]["test_accuracy"])
    # A fixed budget: every triplet spends the same ε.
    assert rows[0]["epsilon"] == rows[1]["epsilon"] and float(rows[0]["epsilon"]) > 0
    # Top 10% of two triplets is the best one.
    assert summary["top10_mean_accuracy"] == pytest.approx(float(rows[0]["test_accuracy"]))
    assert _read(tmp_path / "summary.json")["num_runs"] == 2
    assert _is_png(tmp_path / "sweep.png")

    mtimes = [p.stat().st_mtime_ns for p in runs]
    again = sweep.run_sweep(BASE, output_dir=tmp_path, verbose=0, **grid)
    assert len(calls) == 2 and again["num_trained"] == 0
    assert [p.stat().st_mtime_ns for p in runs] == mtimes
    assert again["top10_mean_accuracy"] == summary["top10_mean_accuracy"]

    # Other settings in the same folder are refused before any training.
    with pytest.raises(ConfigError, match="differing: epochs"):
        sweep.run_sweep(BASE.replace(epochs=2), output_dir=tmp_path, verbose=0, **grid)
    assert len(calls) == 2


def test_sweep_needs_an_output_dir():
    with pytest.raises(ConfigError, match="--output_dir is required"):
        sweep.run_sweep(BASE, scales=[1], inverse_temperatures=[1], offsets=[0],
                        output_dir=None, verbose=0)


@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_pareto_records_accuracy_against_epsilon(tmp_path):
    summary = pareto.run_pareto(BASE.replace(epochs=2), activations=["relu", "tanh"],
                                seeds=[0], output_dir=tmp_path, verbose=0)
    for name in ("pareto.csv", "pareto.json", "runs/relu_seed0.json", "runs/tanh_seed0.json"):
        assert (tmp_path / name).is_file(), name
    assert _is_png(tmp_path / "pareto.png")
    with open(tmp_path / "pareto.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["activation"], r["epoch"]) for r in rows] == [
        ("relu", "1"), ("relu", "2"), ("tanh", "1"), ("tanh", "2")]
    relu, tanh = summary["curves"]["relu"], summary["curves"]["tanh"]
    # Identical hyperparameters, hence identical ε per epoch; ε grows with training.
    assert [r["epsilon"] for r in relu] == [r["epsilon"] for r in tanh]
    assert relu[0]["epsilon"] < relu[1]["epsilon"]
    assert _read(tmp_path / "runs/tanh_seed0.json")["flags"]["activation"] == "tanh"


def test_pareto_refuses_non_private_runs(tmp_path):
    with pytest.raises(ConfigError, match="needs DP-SGD"):
        pareto.run_pareto(BASE.replace(dpsgd=False), output_dir=tmp_path, verbose=0)


@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_activation_norms_records_first_layer_norms(tmp_path):
    summary = activation_norms.run_activation_norms(BASE, output_dir=tmp_path, verbose=0)
    assert _is_png(tmp_path / "activation_norms.png")
    stored = _read(tmp_path / "activation_norms.json")
    assert set(stored["runs"]) == {"relu_nonprivate", "relu_dp", "tanh_dp"}
    for name, run in summary["runs"].items():
        assert run["epochs"] == [0, 1]
        assert len(run["norms"]) == 2 and all(n > 0 for n in run["norms"])
        assert math.isinf(run["epsilon"]) == (name == "relu_nonprivate")
    assert _read(tmp_path / "runs/relu_dp.json")["flags"]["dpsgd"] is True
    # Same initialization (same seed and architecture) before training.
    assert summary["runs"]["relu_dp"]["norms"][0] == pytest.approx(
        summary["runs"]["relu_nonprivate"]["norms"][0])


def test_activation_norms_rejects_unknown_runs(tmp_path):
    with pytest.raises(ConfigError, match="--runs"):
        activation_norms.run_activation_norms(BASE, runs=["gelu_dp"], output_dir=tmp_path,
                                              verbose=0)
