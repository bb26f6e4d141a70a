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
"""Keras 3 vs Keras 2: the same tf_tempered DP step (and non-private step), side by side.

One process can run one Keras only, so this alternates short fresh processes of
benchmarks/dp_step.py: Keras 3, Keras 2, Keras 3, Keras 2, ... (--processes of each,
at least 3), all on the same model, batch and paths. Machine noise (a shared CPU)
then hits both Kerases alike. Each process reports its median ms/step per path;
the table gives, per Keras and path, the median over the processes of those medians,
the ratio Keras 3 / Keras 2 of those, the median of the ratios of back-to-back
process pairs (K3 then K2: less sensitive to load that drifts over minutes), and
every raw number (also in --json).

    python benchmarks/keras_versions.py                             # MNIST CNN, batch 256
    python benchmarks/keras_versions.py --model=cifar10 --steps=3
    python benchmarks/keras_versions.py --render=benchmarks/results/mnist_b256_keras3_vs_keras2.json
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

DP_STEP = pathlib.Path(__file__).resolve().with_name("dp_step.py")
KERASES = (3, 2)


def _run(keras_major, args, out):
    cmd = [sys.executable, str(DP_STEP), f"--keras={keras_major}", f"--model={args.model}",
           f"--batch_size={args.batch_size}", f"--paths={args.paths}", f"--steps={args.steps}",
           f"--rounds={args.rounds}", f"--json={out}"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL,
                   stderr=None if args.verbose else subprocess.DEVNULL, timeout=args.timeout)
    with open(out) as f:
        result = json.load(f)
    if result["environment"]["keras_major"] != keras_major:
        raise RuntimeError(f"asked for Keras {keras_major}, the process ran "
                           f"{result['environment']['keras_version']}")
    return result


def summarize(runs, paths):
    """{keras_major: {path: medians over that Keras' processes of their per-process medians}}."""
    summary = {}
    for k in KERASES:
        mine = [r for r in runs if r["keras_major"] == k]
        summary[k] = {p: {"ms_per_step": statistics.median(r["ms_per_step"][p] for r in mine),
                          "cpu_ms_per_step": statistics.median(r["cpu_ms_per_step"][p] for r in mine),
                          "process_medians": [r["ms_per_step"][p] for r in mine],
                          "process_cpu_medians": [r["cpu_ms_per_step"][p] for r in mine]}
                      for p in paths}
    return summary


def paired_ratios(runs, path):
    """Keras 3 / Keras 2 of each process pair (K3 then K2, run back to back), in order."""
    k3 = [r["ms_per_step"][path] for r in runs if r["keras_major"] == 3]
    k2 = [r["ms_per_step"][path] for r in runs if r["keras_major"] == 2]
    return [a / b for a, b in zip(k3, k2)]


def _load():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("mnist", "cifar10"), default="mnist")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--paths", default="nonprivate,tf_tempered",
                        help="dp_step.py paths that run on both Kerases")
    parser.add_argument("--processes", type=int, default=4,
                        help="fresh processes per Keras, alternated (at least 3)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per process")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--verbose", action="store_true", help="show the processes' stderr")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--render", metavar="JSON",
                        help="print the report of a saved --json result (no measurement)")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            print(render(json.load(f)))
        return
    if args.processes < 3:
        parser.error("--processes must be at least 3 (medians of fewer are not robust)")
    paths = args.paths.split(",")
    load_before = _load()
    runs = []  # in the order they ran
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.processes):
            for k in KERASES:
                out = os.path.join(tmp, f"{i}_{k}.json")
                result = _run(k, args, out)
                medians = {row["path"]: row["ms_per_step"] for row in result["rows"]}
                cpu_medians = {row["path"]: row["cpu_ms_per_step"] for row in result["rows"]}
                runs.append({"keras_major": k, "process": i, "environment": result["environment"],
                             "ms_per_step": medians, "cpu_ms_per_step": cpu_medians,
                             "times": result["times"], "cpu_times": result["cpu_times"]})
                print(f"process {i}, Keras {k}: " + ", ".join(
                    f"{p} {medians[p]:.1f} ms" for p in paths), flush=True)
    print()
    result = {"args": vars(args), "load_average_before": load_before,
              "load_average_after": _load(),
              "versions": {str(k): next(r["environment"] for r in runs if r["keras_major"] == k)
                           for k in KERASES},
              "rows": table_rows(runs, paths), "runs": runs}
    print(render(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


def table_rows(runs, paths):
    """Per path: Keras 3 and Keras 2 medians over processes, their ratios, the raw numbers."""
    summary = summarize(runs, paths)
    rows = []
    for p in paths:
        k3, k2 = summary[3][p], summary[2][p]
        rows.append({"path": p, "keras3_ms_per_step": k3["ms_per_step"],
                     "keras2_ms_per_step": k2["ms_per_step"],
                     "keras3_over_keras2": k3["ms_per_step"] / k2["ms_per_step"],
                     "keras3_cpu_ms_per_step": k3["cpu_ms_per_step"],
                     "keras2_cpu_ms_per_step": k2["cpu_ms_per_step"],
                     "cpu_keras3_over_keras2": k3["cpu_ms_per_step"] / k2["cpu_ms_per_step"],
                     "pair_ratios": paired_ratios(runs, p),
                     "median_pair_ratio": statistics.median(paired_ratios(runs, p)),
                     "keras3_process_medians": k3["process_medians"],
                     "keras2_process_medians": k2["process_medians"]})
    return rows


def within_process_ratios(runs, keras_major, path, key="ms_per_step"):
    """path / nonprivate inside each process of that Keras (the two interleaved there)."""
    return [r[key][path] / r[key]["nonprivate"] for r in runs if r["keras_major"] == keras_major]


def render(result):
    """The markdown report of a result (as written to --json)."""
    args, runs = result["args"], result["runs"]
    versions = {int(k): v for k, v in result["versions"].items()}
    fmt = lambda xs: "/".join(f"{x:.2f}" for x in xs) if xs else "n/a"
    lines = [
        f"{args['model']} CNN, batch {args['batch_size']}; Keras 3 = {versions[3]['keras_version']} "
        f"({versions[3]['keras_module']}), Keras 2 = {versions[2]['keras_version']} "
        f"({versions[2]['keras_module']}); TF {versions[3]['tensorflow']}, Python "
        f"{versions[3]['python']}, {versions[3]['cpus']} CPUs; {args['processes']} alternating "
        f"processes per Keras (K3, K2, K3, ...), each {args['rounds']} rounds x {args['steps']} "
        f"steps; load average (1/5/15 min) before {fmt(result['load_average_before'])}, after "
        f"{fmt(result['load_average_after'])}",
        "| path | Keras 3 ms/step | Keras 2 ms/step | Keras 3 / Keras 2 | Keras 3 CPU ms | "
        "Keras 2 CPU ms | CPU ratio | median pair ratio | Keras 3 per process | "
        "Keras 2 per process |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for row in result["rows"]:
        lines.append(
            f"| {row['path']} | {row['keras3_ms_per_step']:.1f} | {row['keras2_ms_per_step']:.1f} | "
            f"{row['keras3_over_keras2']:.2f} | {row['keras3_cpu_ms_per_step']:.1f} | "
            f"{row['keras2_cpu_ms_per_step']:.1f} | {row['cpu_keras3_over_keras2']:.2f} | "
            f"{row['median_pair_ratio']:.2f} | "
            f"{' '.join(f'{x:.1f}' for x in row['keras3_process_medians'])} | "
            f"{' '.join(f'{x:.1f}' for x in row['keras2_process_medians'])} |")
    paths = [row["path"] for row in result["rows"]]
    if "nonprivate" in paths:
        for p in paths:
            if p == "nonprivate":
                continue
            lines.append("")
            for k in KERASES:
                wall = within_process_ratios(runs, k, p)
                cpu = within_process_ratios(runs, k, p, "cpu_ms_per_step")
                lines.append(
                    f"{p} / nonprivate on Keras {k}, within each process (interleaved there): "
                    f"median {statistics.median(wall):.2f} ({' '.join(f'{x:.2f}' for x in wall)}); "
                    f"CPU median {statistics.median(cpu):.2f} ({' '.join(f'{x:.2f}' for x in cpu)})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
