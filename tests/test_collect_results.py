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
"""collect_results: per-seed metrics.json -> the issue's rows (mean/std, ε, δ, seeds, command)."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tf_tempered.experiments import collect_results, results
from tf_tempered.experiments.common import ConfigError, TrainConfig

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

ACCURACIES = {0: 0.9871, 1: 0.9880, 2: 0.9866}


def _write_runs(root, dataset="mnist", target=2.93, accuracies=ACCURACIES, **flag_changes):
    dirs = []
    for seed, acc in accuracies.items():
        d = root / f"{dataset}_{target}_s{seed}"
        flags = TrainConfig(dataset=dataset, target_epsilon=target, seed=seed,
                            output_dir=str(d), **flag_changes).to_dict()
        results.write_json(d / "metrics.json", {
            "test_accuracy": acc, "epsilon": target - 1e-4 * seed, "delta": 1e-5,
            "epsilon_holds": True, "dp_randomness": "secret", "flags": flags,
            "wall_time_s": 60.0 + seed, "peak_rss_mib": 1000.0 + seed})
        dirs.append(str(d))
    return dirs


def test_rows_have_the_issue_format_and_values(tmp_path):
    dirs = _write_runs(tmp_path) + _write_runs(tmp_path, "fashion_mnist", 2.7, {3: 0.88, 4: 0.89})
    rows = collect_results.aggregate(dirs, recipe="paper")
    assert [(r["dataset"], r["seeds"]) for r in rows] == [("mnist", [0, 1, 2]),
                                                        ("fashion_mnist", [3, 4])]
    mnist = rows[0]
    assert set(mnist) == {"dataset", "recipe", "mean_test_accuracy", "std_test_accuracy",
                          "epsilon", "delta", "seeds", "command", "wall_time_s", "peak_rss_mib"}
    assert mnist["wall_time_s"] == [60.0, 61.0, 62.0]  # each seed's, in seed order
    assert mnist["peak_rss_mib"] == [1000.0, 1001.0, 1002.0]
    values = np.array(list(ACCURACIES.values()))
    assert mnist["mean_test_accuracy"] == pytest.approx(values.mean(), abs=1e-15)
    assert mnist["std_test_accuracy"] == pytest.approx(values.std(ddof=1), abs=1e-15)
    assert mnist["epsilon"] == 2.93 and mnist["delta"] == 1e-5  # the largest ε of the seeds
    assert rows[1]["std_test_accuracy"] == pytest.approx(np.std([0.88, 0.89], ddof=1))
    assert "--dataset=mnist" in mnist["command"] and "--target_epsilon=2.93" in mnist["command"]
    assert mnist["command"].endswith("--seed=SEED")


def test_peak_memory_from_a_time_v_file_when_the_run_did_not_record_it(tmp_path):
    dirs = _write_runs(tmp_path)
    for d in dirs[:2]:
        older = results.read_json(pathlib.Path(d) / "metrics.json")
        del older["peak_rss_mib"]  # written before the script recorded it
        results.write_json(pathlib.Path(d) / "metrics.json", older)
    (pathlib.Path(dirs[0]) / "time_v.txt").write_text(
        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 6:28.37\n"
        "\tMaximum resident set size (kbytes): 2162748\n")
    rows = collect_results.aggregate(dirs, recipe="paper")
    assert rows[0]["peak_rss_mib"] == [2162748 / 1024, None, 1002.0]


def test_a_flag_missing_from_an_older_run_counts_as_its_default(tmp_path):
    dirs = _write_runs(tmp_path)
    older = results.read_json(pathlib.Path(dirs[0]) / "metrics.json")
    del older["flags"]["feature_norm"]  # written before the flag existed (default "group")
    results.write_json(pathlib.Path(dirs[0]) / "metrics.json", older)
    rows = collect_results.aggregate(dirs, recipe="paper")
    assert len(rows) == 1 and rows[0]["seeds"] == [0, 1, 2]
    changed = results.read_json(pathlib.Path(dirs[1]) / "metrics.json")
    changed["flags"]["feature_norm"] = "none"  # a real difference is still refused
    results.write_json(pathlib.Path(dirs[1]) / "metrics.json", changed)
    with pytest.raises(ConfigError, match="feature_norm"):
        collect_results.aggregate(dirs, recipe="paper")


def test_refuses_mixed_configs_insecure_runs_and_missing_recipe(tmp_path):
    mixed = _write_runs(tmp_path / "a", accuracies={0: 0.9}) + _write_runs(
        tmp_path / "b", accuracies={1: 0.9}, learning_rate=1.0)
    with pytest.raises(ConfigError, match="learning_rate"):
        collect_results.aggregate(mixed, recipe="paper")
    with pytest.raises(ConfigError, match="no recipe recorded"):
        collect_results.aggregate(_write_runs(tmp_path / "c"))
    (run,) = _write_runs(tmp_path / "d", accuracies={0: 0.9})
    metrics = json.loads((tmp_path / "d" / "mnist_2.93_s0" / "metrics.json").read_text())
    metrics.update(epsilon_holds=False, dp_randomness="insecure")
    with pytest.raises(ConfigError, match="does not hold"):
        collect_results.aggregate([metrics], recipe="paper")
    with pytest.raises(ConfigError, match="no metrics.json"):
        collect_results.aggregate([str(tmp_path / "nowhere")], recipe="paper")


@pytest.mark.extended  # the whole command in a subprocess; its functions are tested here
def test_cli_merges_json_and_appends_markdown(tmp_path):
    dirs = _write_runs(tmp_path, recipe="paper")
    out = tmp_path / "results" / "mnist.json"
    cmd = [sys.executable, "-m", "tf_tempered.experiments.collect_results",
           f"--runs={','.join(dirs)}", f"--out={out}"]
    for _ in range(2):  # a second collection replaces the JSON row, appends a markdown row
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    rows = json.loads(out.read_text())
    assert len(rows) == 1 and rows[0]["recipe"] == "paper" and rows[0]["seeds"] == [0, 1, 2]
    md = out.with_suffix(".md").read_text().splitlines()
    assert md[0].startswith("| dataset | recipe |") and len(md) == 4
    assert md[2].startswith("| mnist | paper | 98.72 ± 0.07 | 2.93 | 1e-05 | 0, 1, 2 |")
