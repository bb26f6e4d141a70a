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
"""Copies the Table 4 runs' metrics.json here and prints the README table (mean ± std over seeds).

    python docs/table4/collect.py runs/table4 runs/table4_budget > docs/table4/table.md
"""

import collections
import json
import pathlib
import shutil
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
PAPER = {("mnist", "tanh"): "98.1% @ 2.93", ("mnist", "relu"): "96.6% @ 2.93",
         ("fashion_mnist", "tanh"): "86.1% @ 2.7", ("fashion_mnist", "relu"): "81.9% @ 2.7"}


def main(run_roots):
    groups = collections.defaultdict(list)
    for root in map(pathlib.Path, run_roots):
        for metrics_path in sorted(root.glob("*/metrics.json")):
            metrics = json.loads(metrics_path.read_text())
            flags = metrics["flags"]
            key = (root.name, flags["dataset"], flags["activation"], flags["learning_rate"],
                   flags.get("target_epsilon"), flags.get("noise_multiplier"))
            groups[key].append(metrics)
            target = HERE / root.name / metrics_path.parent.name
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy(metrics_path, target / "metrics.json")
    print("| runs | dataset | activation | lr | σ | test accuracy (mean ± std) | seeds | ε (δ=1e-5) | paper |")
    print("|---|---|---|---:|---:|---:|---:|---:|---|")
    for key in sorted(groups):
        root, dataset, activation, lr, _, _ = key
        runs = groups[key]
        accuracies = [100 * m["test_accuracy"] for m in runs]
        spread = f" ± {statistics.stdev(accuracies):.2f}" if len(runs) > 1 else ""
        sigma = runs[0]["noise_multiplier"]
        epsilon = max(m["epsilon"] for m in runs)
        print(f"| {root} | {dataset} | {activation} | {lr} | {sigma:.3f} | "
              f"{statistics.mean(accuracies):.2f}%{spread} | {len(runs)} | {epsilon:.3f} | "
              f"{PAPER.get((dataset, activation), '')} |")


if __name__ == "__main__":
    main(sys.argv[1:])
