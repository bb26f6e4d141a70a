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
"""The train script end to end: DP-SGD against ``--nodpsgd``, in paired whole processes.

Each pair runs the same ``python -m tf_tempered.experiments.train`` command twice in
fresh processes, once with DP-SGD (Poisson batches, clipping, noise, accounting) and
once with ``--nodpsgd`` (shuffled batches, plain SGD), back to back; the order
alternates from pair to pair, so load that drifts over minutes hits both alike. Two
times per process: the whole process (imports, data loading, tracing, training,
evaluation) and the script's own ``wall_time_s`` (metrics.json: the training loop and
evaluation). The table gives the median of each over the pairs and the median of the
per-pair ratios DP / non-private.

    python benchmarks/end_to_end.py                     # MNIST, 2 epochs, 3 pairs
    python benchmarks/end_to_end.py --pairs=5 --json=benchmarks/results/end_to_end_mnist.json
    python benchmarks/end_to_end.py --train_args="--dataset=digits --epochs=20 --batch_size=64"
    python benchmarks/end_to_end.py --dp_args=--nopoisson_padding   # flags of the DP run only
    python benchmarks/end_to_end.py --render=benchmarks/results/end_to_end_mnist.json
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import process_runs  # noqa: E402

DEFAULT_TRAIN_ARGS = "--dataset=mnist --data_dir=../shared/data --epochs=2 --nosave_model"
KINDS = ("dp", "nonprivate")


def run_once(train_args, dp, workdir, timeout, dp_args=""):
    """Runs the train script once in a fresh process; returns its timings and metrics."""
    out = tempfile.mkdtemp(dir=workdir)
    cmd = [sys.executable, "-m", "tf_tempered.experiments.train", *shlex.split(train_args),
           f"--output_dir={out}"] + (shlex.split(dp_args) if dp else ["--nodpsgd"])
    start = time.monotonic()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=timeout)
    process_s = time.monotonic() - start
    with open(os.path.join(out, "metrics.json")) as f:
        metrics = json.load(f)
    return {"process_s": process_s, "script_s": metrics["wall_time_s"],
            "test_accuracy": metrics["test_accuracy"], "epsilon": metrics.get("epsilon"),
            "steps": metrics.get("steps")}


def run_pairs(train_args, pairs, timeout, dp_args=""):
    """``pairs`` back-to-back (DP, non-private) runs, the order alternating."""
    results = []
    with tempfile.TemporaryDirectory() as workdir:
        for i in range(pairs):
            order = KINDS if i % 2 == 0 else KINDS[::-1]
            pair = {kind: run_once(train_args, kind == "dp", workdir, timeout, dp_args)
                    for kind in order}
            pair["first"] = order[0]
            results.append(pair)
            print(f"pair {i + 1}/{pairs}: DP {pair['dp']['process_s']:.1f} s, non-private "
                  f"{pair['nonprivate']['process_s']:.1f} s", file=sys.stderr)
    return results


def summarize(pairs):
    """Medians per kind and of the per-pair ratios DP / non-private, for both timings."""
    summary = {}
    for key in ("process_s", "script_s"):
        dp = [p["dp"][key] for p in pairs]
        nonprivate = [p["nonprivate"][key] for p in pairs]
        summary[key] = {"dp": statistics.median(dp), "nonprivate": statistics.median(nonprivate),
                        "ratio": statistics.median(d / n for d, n in zip(dp, nonprivate))}
    return summary


def render(result):
    """The markdown table of a result (as written by --json)."""
    s = summarize(result["pairs"])
    dp_args = f" {result['dp_args']}" if result.get("dp_args") else ""
    lines = [f"End to end: `python -m tf_tempered.experiments.train {result['train_args']}` with "
             f"DP-SGD{dp_args} vs `--nodpsgd`, {len(result['pairs'])} pairs of fresh processes "
             f"({result['environment']}); load average before {result['load_before']}, "
             f"after {result['load_after']}", "",
             "| time | DP-SGD (s, median) | --nodpsgd (s, median) | DP / non-private (median of pairs) |",
             "|---|---:|---:|---:|"]
    for key, label in (("process_s", "whole process"), ("script_s", "script's wall_time_s")):
        lines.append(f"| {label} | {s[key]['dp']:.1f} | {s[key]['nonprivate']:.1f} | "
                     f"{s[key]['ratio']:.2f} |")
    lines += ["", "| pair | first | DP process s | non-private process s | ratio | DP test acc | "
              "non-private test acc | ε |", "|---:|---|---:|---:|---:|---:|---:|---:|"]
    for i, p in enumerate(result["pairs"], 1):
        dp, npv = p["dp"], p["nonprivate"]
        lines.append(f"| {i} | {p['first']} | {dp['process_s']:.1f} | {npv['process_s']:.1f} | "
                     f"{dp['process_s'] / npv['process_s']:.2f} | {dp['test_accuracy']:.4f} | "
                     f"{npv['test_accuracy']:.4f} | {dp['epsilon']:.3g} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_args", default=DEFAULT_TRAIN_ARGS,
                        help="the train script's flags (without --output_dir and --nodpsgd)")
    parser.add_argument("--dp_args", default="", help="flags of the DP run only, e.g. "
                        "--nopoisson_padding")
    parser.add_argument("--pairs", type=int, default=3, help="(DP, non-private) process pairs")
    process_runs.add_output_arguments(parser)
    args = parser.parse_args()
    if args.render:
        return process_runs.render_file(args.render, render)
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    load_before = process_runs.load_average()
    pairs = run_pairs(args.train_args, args.pairs, args.timeout, args.dp_args)
    return process_runs.finish(
        {"train_args": args.train_args, "dp_args": args.dp_args, "pairs": pairs},
        load_before=load_before, json_path=args.json, render=render)


if __name__ == "__main__":
    main()
