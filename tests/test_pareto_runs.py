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
"""pareto_runs: finished runs' per-epoch (ε, test accuracy) → averaged curves and a plot."""

import subprocess
import sys

import numpy as np
import pytest

from tf_tempered.experiments import pareto_runs, results
from tf_tempered.experiments.common import ConfigError

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

EPSILONS = (0.8, 1.5, 2.93)


def _run(root, name, accuracies, *, dataset="mnist", delta=1e-5, epsilons=EPSILONS, **extra):
    history = [{"epoch": e + 1, "steps": 10 * (e + 1), "epsilon": eps, "test_accuracy": acc}
               for e, (eps, acc) in enumerate(zip(epsilons, accuracies))]
    metrics = {"test_accuracy": accuracies[-1], "epsilon": epsilons[-1], "delta": delta,
               "epsilon_holds": True, "dp_randomness": "secret", "history": history,
               "flags": {"dataset": dataset}}
    metrics.update(extra)
    results.write_json(root / name / "metrics.json", metrics)
    return str(root / name)


def test_curves_average_seeds_epoch_by_epoch(tmp_path):
    a = _run(tmp_path, "a0", (0.90, 0.95, 0.98))
    b = _run(tmp_path, "a1", (0.92, 0.96, 0.99))
    c = _run(tmp_path, "t0", (0.80, 0.90, 0.97))
    curves, summary = pareto_runs.curves_from_runs({"best": [a, b], "tanh": [c]})
    best = curves["best"]
    assert [r["epsilon"] for r in best] == list(EPSILONS)
    np.testing.assert_allclose([r["test_accuracy_mean"] for r in best], [0.91, 0.955, 0.985])
    np.testing.assert_allclose([r["test_accuracy_std"] for r in best], [0.01, 0.005, 0.005])
    assert summary["final"]["tanh"]["test_accuracy_mean"] == pytest.approx(0.97)
    assert summary["dataset"] == "mnist" and summary["delta"] == 1e-5


@pytest.mark.parametrize("extra, match", [
    ({"epsilon_holds": False}, "does not hold"),
    ({"dp_randomness": "insecure_seed"}, "does not hold"),
])
def test_runs_whose_epsilon_does_not_hold_are_refused(tmp_path, extra, match):
    run = _run(tmp_path, "r", (0.9, 0.95, 0.98), **extra)
    with pytest.raises(ConfigError, match=match):
        pareto_runs.curves_from_runs({"x": [run]})


def test_seeds_of_different_configs_and_mixed_datasets_are_refused(tmp_path):
    a = _run(tmp_path, "a", (0.9, 0.95, 0.98))
    b = _run(tmp_path, "b", (0.9, 0.95, 0.98), epsilons=(0.7, 1.5, 2.93))
    with pytest.raises(ConfigError, match="epoch 1 has ε"):
        pareto_runs.curves_from_runs({"x": [a, b]})
    f = _run(tmp_path, "f", (0.8, 0.85, 0.88), dataset="fashion_mnist")
    with pytest.raises(ConfigError, match="mix datasets"):
        pareto_runs.curves_from_runs({"x": [a], "y": [f]})
    with pytest.raises(ConfigError, match="no metrics.json"):
        pareto_runs.curves_from_runs({"x": [str(tmp_path / "missing")]})


@pytest.mark.extended  # the whole command in a subprocess; its functions are tested here
def test_cli_writes_csv_json_and_png(tmp_path):
    a = _run(tmp_path, "a", (0.90, 0.95, 0.98))
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "tf_tempered.experiments.pareto_runs",
                           f"--curve=best={a}", f"--output_dir={out}"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "best: test accuracy 0.9800" in done.stdout
    csv = (out / "pareto.csv").read_text().splitlines()
    assert csv[0].startswith("label,epoch,steps,epsilon") and len(csv) == 4
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results.read_json(out / "pareto.json")["final"]["best"]["epsilon"] == 2.93
    bad = subprocess.run([sys.executable, "-m", "tf_tempered.experiments.pareto_runs",
                          "--curve=nolabel", f"--output_dir={out}"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode != 0 and "--curve='nolabel' is malformed" in bad.stderr
