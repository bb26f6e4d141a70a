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
"""Aggregates per-seed runs (metrics.json) into result rows: mean ± std test accuracy at one ε.

    python -m tf_tempered.experiments.collect_results --runs=runs/s0,runs/s1,runs/s2 \\
        --recipe=paper --out=results/mnist_paper.json

Each ``--runs`` entry is a run's ``--output_dir`` (or its metrics.json). Runs are grouped
by dataset × recipe × ε; each group becomes one row:

    {"dataset": "mnist", "recipe": "paper", "mean_test_accuracy": 0.987,
     "std_test_accuracy": 0.001, "epsilon": 2.93, "delta": 1e-05, "seeds": [0, 1, 2],
     "command": "python -m tf_tempered.experiments.train ... --seed=SEED"}

Accuracies are fractions; ``std_test_accuracy`` is the sample standard deviation
(ddof = 1; 0 for one seed); ``epsilon`` is the largest ε of the group's runs. A group
must share every flag but ``seed`` and ``output_dir`` and δ; runs whose ε does not
hold (``--insecure_dp_seed``) or that are non-private are refused. Rows are merged into
``--out`` (a row with the same dataset, recipe and ε is replaced) and appended to the
markdown table ``--markdown`` (default: ``--out`` with ``.md``).
"""

import pathlib

import numpy as np

from tf_tempered.experiments import command_line, common, results
from tf_tempered.experiments.search import best_command

__all__ = ["aggregate", "write_rows", "markdown_row", "define_flags", "main", "cli"]

_IGNORED = ("seed", "output_dir")


def _load(run):
    path = pathlib.Path(run)
    path = path / "metrics.json" if path.is_dir() else path
    if not path.is_file():
        raise common.ConfigError(f"--runs: {run} has no metrics.json. Fix: pass each run's "
                                 "--output_dir.")
    return path, results.read_json(path)


def aggregate(metrics, recipe=None, command=None):
    """Rows (one per dataset × recipe × ε) from ``metrics``: dicts or metrics.json paths."""
    groups = {}
    for item in metrics:
        where, m = _load(item) if not isinstance(item, dict) else ("<dict>", item)
        flags = m.get("flags") or {}
        if m.get("epsilon_holds") is False or m.get("dp_randomness") != "secret":
            raise common.ConfigError(f"{where}: its ε does not hold (non-private or "
                                     "--insecure_dp_seed); results must come from private runs.")
        if "test_accuracy" not in m:
            raise common.ConfigError(f"{where}: no test_accuracy.")
        name = recipe or flags.get("recipe")
        if not name:
            raise common.ConfigError(f"{where}: no recipe recorded. Fix: pass --recipe=NAME.")
        target = flags.get("target_epsilon")
        key = (flags.get("dataset"), name, target if target is not None
               else round(float(m["epsilon"]), 4))
        groups.setdefault(key, []).append((where, m, flags))
    rows = []
    # A flag missing from an older run's metrics.json had its default value then.
    defaults = common.TrainConfig().to_dict()
    for (dataset, name, _), runs in groups.items():
        first = {k: v for k, v in runs[0][2].items() if k not in _IGNORED}
        for where, m, flags in runs[1:]:
            diff = sorted(k for k in set(first) | set(flags) if k not in _IGNORED
                          and flags.get(k, defaults.get(k)) != first.get(k, defaults.get(k)))
            if diff or m["delta"] != runs[0][1]["delta"]:
                raise common.ConfigError(f"{where}: differs from {runs[0][0]} in "
                                         f"{diff or ['delta']}; one row averages seeds of one "
                                         "config only.")
        accuracy = np.array([float(m["test_accuracy"]) for _, m, _ in runs])
        seeds = [flags.get("seed") for _, _, flags in runs]
        if len(set(seeds)) != len(seeds):
            raise common.ConfigError(f"{dataset}/{name}: seeds {seeds} repeat; each run "
                                     "must have its own --seed.")
        if command is None:
            config = common.TrainConfig(**{**first, "seed": 0})
            cmd = best_command(config, output_dir="runs/SEED") + " --seed=SEED"
        else:
            cmd = command
        rows.append({"dataset": dataset, "recipe": name,
                     "mean_test_accuracy": float(accuracy.mean()),
                     "std_test_accuracy": float(accuracy.std(ddof=1)) if len(runs) > 1 else 0.0,
                     "epsilon": max(float(m["epsilon"]) for _, m, _ in runs),
                     "delta": float(runs[0][1]["delta"]), "seeds": seeds, "command": cmd,
                     # Per seed, as each run recorded them (None: not recorded by its version).
                     "wall_time_s": [m.get("wall_time_s") for _, m, _ in runs],
                     "peak_rss_mib": [_peak_rss_mib(where, m) for where, m, _ in runs]})
    return rows


def _peak_rss_mib(where, metrics):
    """The run's peak resident memory: its metrics.json's, else that of a ``time_v.txt``
    (``/usr/bin/time -v``'s output) beside it, else None."""
    if metrics.get("peak_rss_mib") is not None or where == "<dict>":
        return metrics.get("peak_rss_mib")
    time_v = pathlib.Path(where).parent / "time_v.txt"
    if time_v.is_file():
        for line in time_v.read_text().splitlines():
            if "Maximum resident set size (kbytes)" in line:
                return int(line.rsplit(":", 1)[1]) / 1024
    return None


def markdown_row(row):
    """``| dataset | recipe | mean ± std (%) | ε | δ | seeds | command |``."""
    return (f"| {row['dataset']} | {row['recipe']} | {100 * row['mean_test_accuracy']:.2f} ± "
            f"{100 * row['std_test_accuracy']:.2f} | {row['epsilon']:.3g} | {row['delta']:g} | "
            f"{', '.join(map(str, row['seeds']))} | `{row['command']}` |")


_HEADER = ("| dataset | recipe | test accuracy (%, mean ± std) | ε | δ | seeds | command |\n"
           "|---|---|---|---|---|---|---|\n")


def write_rows(rows, out, markdown=None):
    """Merges ``rows`` into the JSON list at ``out``; appends them to ``markdown``."""
    out = pathlib.Path(out)
    existing = results.read_json(out) if out.is_file() else []

    def key(r):
        return (r["dataset"], r["recipe"], round(float(r["epsilon"]), 4))

    new = {key(r) for r in rows}
    results.write_json(out, [r for r in existing if key(r) not in new] + list(rows))
    md = pathlib.Path(markdown) if markdown else out.with_suffix(".md")
    text = md.read_text() if md.is_file() else _HEADER
    md.write_text(text + "".join(markdown_row(r) + "\n" for r in rows))
    return out, md


def define_flags():
    """--runs, --recipe, --out, --markdown, --command."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    flags.DEFINE_list("runs", [], "Run folders (each with metrics.json), one per seed.")
    flags.DEFINE_string("recipe", None, "Recipe name of the rows (default: the runs' --recipe).")
    flags.DEFINE_string("out", None, "JSON file of rows to merge into.")
    flags.DEFINE_string("markdown", None, "Markdown table to append to (default: --out, .md).")
    flags.DEFINE_string("command", None, "Command to record (default: rebuilt from the flags).")


def _run_from_flags(f):
    if not f["runs"].value or not f["out"].value:
        raise common.ConfigError("--runs and --out are required, e.g. --runs=r/s0,r/s1,r/s2 "
                                 "--out=results/mnist.json.")
    rows = aggregate(f["runs"].value, recipe=f["recipe"].value, command=f["command"].value)
    out, md = write_rows(rows, f["out"].value, f["markdown"].value)
    for row in rows:
        print(markdown_row(row))
    print(f"Wrote {out} and {md}.")


main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
