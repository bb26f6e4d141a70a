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
"""One table of every benchmarks/dp_step.py run: its command, ratios and the path of each layer.

Reads the ``--json`` files of dp_step.py (in the order given) and prints markdown: one
row per path of each run (wall and CPU time, peak memory, each against the run's
non-private step compiled the same way, measured side by side in that run's process),
then, per run, the command that made it and which handler and path each layer of its
DP step took. ``bash benchmarks/run_all.sh`` writes benchmarks/results/summary.md with
it after its runs.

    python benchmarks/summarize.py benchmarks/results/mnist_b256.json benchmarks/results/text_b256_keras3.json
"""

import argparse
import json
import os

# dp_step.py's flags in its args dict, and their defaults (left out of the command).
_FLAG_DEFAULTS = {"keras": None, "model": "mnist", "batch_size": None, "paths": None,
                  "steps": 10, "rounds": 10, "stock_steps": 1, "dynamic_batch": False,
                  "jit_compile": False}


def command(result, path):
    """The dp_step.py command line that wrote ``result`` (a --json file at ``path``)."""
    args = result["args"]
    parts = ["python benchmarks/dp_step.py"]
    for flag, default in _FLAG_DEFAULTS.items():
        value = args.get(flag, default)
        if value is None or value == default:
            continue
        parts.append(f"--{flag}" if value is True else f"--{flag}={value}")
    parts.append(f"--json={path}")
    return " ".join(parts)


def _ratio(value):
    return "" if value is None else f"{value:.2f}"


def run_rows(result, name):
    """Markdown rows of one run: model, batch, Keras, path, times and ratios."""
    args, env = result["args"], result["environment"]
    batch = f"{args['batch_size']}{' (dynamic)' if args.get('dynamic_batch') else ''}"
    rows = []
    for row in result["rows"]:
        rows.append(f"| {args['model']} | {batch} | {env['keras_major']} | {row['path']} | "
                    f"{row['ms_per_step']:.1f} | {_ratio(row['time_ratio'])} | "
                    f"{_ratio(row['cpu_ratio'])} | {row['peak_bytes'] / 2**20:.0f} | "
                    f"{_ratio(row['memory_ratio'])} | {name} |")
    return rows


def layer_path_section(result, name, path):
    """The command of one run and the handler/path of each layer of its DP paths."""
    env = result["environment"]
    loads = "/".join(f"{x:.2f}" for x in env["load_average_before"])
    lines = [f"### {name}", "", f"`{command(result, path)}` (Keras {env['keras_version']}, "
             f"TF {env['tensorflow']}, Python {env['python']}; load average before {loads})", ""]
    for row in result["rows"]:
        if not row.get("layer_paths"):
            continue
        paths = ", ".join(f"{lp['layer']} {lp['handler']}: {lp['path']}"
                          for lp in row["layer_paths"])
        lines += [f"- {row['path']}: {paths}"]
    return lines + [""]


def summarize(files, table_only=False):
    """The markdown summary of the dp_step.py --json ``files`` (only the table: table_only)."""
    results = []
    for path in files:
        with open(path) as f:
            results.append((path, os.path.splitext(os.path.basename(path))[0], json.load(f)))
    lines = ["| model | batch | Keras | path | ms/step | × non-private | CPU × non-private | "
             "peak MiB | memory × non-private | run |", "|---|---|---|---|---:|---:|---:|---:|---:|---|"]
    for _, name, result in results:
        lines += run_rows(result, name)
    if table_only:
        return "\n".join(lines)
    lines += ["", "## Commands and per-layer paths", ""]
    for path, name, result in results:
        lines += layer_path_section(result, name, path)
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="dp_step.py --json files, in table order")
    parser.add_argument("--title", default="Every dp_step.py row of one run_all.sh")
    parser.add_argument("--table_only", action="store_true", help="only the table of rows")
    args = parser.parse_args()
    if not args.table_only:
        print(f"# {args.title}\n")
    print(summarize(args.files, table_only=args.table_only))


if __name__ == "__main__":
    main()
