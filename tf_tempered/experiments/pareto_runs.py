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
"""Test accuracy against ε for finished runs (no training): e.g. a recipe against baselines.

    python -m tf_tempered.experiments.pareto_runs \\
        --curve="best=results/runs/mnist_best_seed0,results/runs/mnist_best_seed1" \\
        --curve="tanh=docs/table4/table4_budget/mnist_tanh_seed0" \\
        --output_dir=results/pareto_mnist

Like the paper's Figure 3 (and :mod:`tf_tempered.experiments.pareto`, which trains its
runs), each run contributes its test accuracy after every epoch together with the ε spent
by then; a curve averages its runs (seeds of one configuration, so the same ε per epoch)
epoch by epoch. Every point is therefore a model actually trained at that ε, and every run
must be private with secret DP randomness, on one dataset and one δ. Writes
``pareto.csv``, ``pareto.json`` and ``pareto.png`` into ``--output_dir``.
"""

import pathlib

import numpy as np

from tf_tempered._plotting import agg_figure
from tf_tempered.experiments import command_line, common, results

__all__ = ["load_runs", "average_curve", "curves_from_runs", "plot_curves", "define_flags",
           "main", "cli"]

_COLUMNS = ("label", "epoch", "steps", "epsilon", "test_accuracy_mean", "test_accuracy_std",
            "num_runs")


def load_runs(paths):
    """metrics.json dicts of ``paths`` (run folders or files); refuses runs whose ε does not hold."""
    loaded = []
    for run in paths:
        path = pathlib.Path(run)
        path = path / "metrics.json" if path.is_dir() else path
        if not path.is_file():
            raise common.ConfigError(f"--curve: {run} has no metrics.json. Fix: pass each run's "
                                     "--output_dir.")
        metrics = results.read_json(path)
        if metrics.get("epsilon_holds") is False or metrics.get("dp_randomness",
                                                                "secret") != "secret":
            raise common.ConfigError(f"{path}: its ε does not hold (non-private or "
                                     "--insecure_dp_seed); a privacy curve needs private runs.")
        if not metrics.get("history") or "test_accuracy" not in metrics["history"][0]:
            raise common.ConfigError(f"{path}: no per-epoch test accuracy in its history "
                                     "(runs with --validation_size evaluate the test set once, "
                                     "at the end). Fix: use runs trained without a validation "
                                     "split.")
        loaded.append((str(path), metrics))
    return loaded


def average_curve(label, histories):
    """One row per epoch: ε of that epoch and the mean/std test accuracy over ``histories``.

    >>> h = [{"epoch": 1, "steps": 5, "epsilon": 0.5, "test_accuracy": 0.9}]
    >>> average_curve("x", [h, [dict(h[0], test_accuracy=0.8)]])[0]["test_accuracy_mean"]
    0.85
    """
    epochs = min(len(h) for h in histories)  # equal unless a budget stopped one early
    curve = []
    for e in range(epochs):
        epsilons = {round(float(h[e]["epsilon"]), 6) for h in histories}
        if len(epsilons) != 1:
            raise common.ConfigError(f"curve {label!r}: epoch {e + 1} has ε {sorted(epsilons)}; "
                                     "a curve averages seeds of one configuration (same σ, "
                                     "batch, epochs). Fix: give it its own --curve.")
        accuracies = np.array([float(h[e]["test_accuracy"]) for h in histories])
        curve.append({"label": label, "epoch": histories[0][e]["epoch"],
                      "steps": histories[0][e]["steps"],
                      "epsilon": float(histories[0][e]["epsilon"]),
                      "test_accuracy_mean": round(float(accuracies.mean()), 6),
                      "test_accuracy_std": round(float(accuracies.std()), 6),
                      "num_runs": len(histories)})
    return curve


def curves_from_runs(curve_runs):
    """``{label: [paths]}`` → ``(curves, summary)``; one dataset and one δ for all runs."""
    curves, final, datasets, deltas = {}, {}, set(), set()
    for label, paths in curve_runs.items():
        runs = load_runs(paths)
        for _, m in runs:
            datasets.add((m.get("flags") or {}).get("dataset"))
            deltas.add(float(m["delta"]))
        curves[label] = average_curve(label, [m["history"] for _, m in runs])
        accuracies = [float(m["test_accuracy"]) for _, m in runs]
        final[label] = {"test_accuracy_mean": float(np.mean(accuracies)),
                        "test_accuracy_std": float(np.std(accuracies)),
                        "epsilon": max(float(m["epsilon"]) for _, m in runs),
                        "runs": [p for p, _ in runs]}
    if len(datasets) > 1 or len(deltas) > 1:
        raise common.ConfigError(f"the curves mix datasets {sorted(map(str, datasets))} or δ "
                                 f"{sorted(deltas)}; one plot compares one dataset at one δ.")
    summary = {"dataset": next(iter(datasets)), "delta": next(iter(deltas)), "curves": curves,
               "final": final}
    return curves, summary


def plot_curves(curves, delta, path, title="Test accuracy vs privacy budget", ylim=None):
    """Mean ± std test accuracy against ε, one line per curve."""
    figure, (ax,) = agg_figure(figsize=(5.5, 3.8))
    for label, curve in curves.items():
        eps = [r["epsilon"] for r in curve]
        mean = np.array([r["test_accuracy_mean"] for r in curve])
        std = np.array([r["test_accuracy_std"] for r in curve])
        ax.plot(eps, mean, marker="o", markersize=3, label=label)
        ax.fill_between(eps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel(f"ε (δ = {delta:g})")
    ax.set_ylabel("test accuracy")
    if ylim:
        ax.set_ylim(*ylim)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    figure.savefig(path, format="png", dpi=120)


def _parse_curve(spec):
    label, sep, paths = spec.partition("=")
    paths = [p for p in paths.split(",") if p]
    if not sep or not label or not paths:
        raise common.ConfigError(f"--curve={spec!r} is malformed. Fix: --curve=LABEL=RUN[,RUN...] "
                                 "(run folders holding metrics.json).")
    return label, paths


def define_flags():
    """--curve (repeatable), --output_dir, --title, --ymin."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    flags.DEFINE_multi_string("curve", [], "LABEL=RUN[,RUN...]: one curve, averaged over runs.")
    flags.DEFINE_string("output_dir", None, "Where pareto.csv, pareto.json and pareto.png go.")
    flags.DEFINE_string("title", "Test accuracy vs privacy budget", "Plot title.")
    flags.DEFINE_float("ymin", None, "Lower limit of the accuracy axis (default: automatic).")


def _run_from_flags(f):
    if not f["curve"].value or not f["output_dir"].value:
        raise common.ConfigError("--curve (at least one) and --output_dir are required, e.g. "
                                 "--curve=best=runs/s0,runs/s1 --output_dir=results/pareto.")
    curve_runs = dict(_parse_curve(spec) for spec in f["curve"].value)
    curves, summary = curves_from_runs(curve_runs)
    out = pathlib.Path(f["output_dir"].value)
    out.mkdir(parents=True, exist_ok=True)
    results.write_csv(out / "pareto.csv", [r for c in curves.values() for r in c], _COLUMNS)
    ymin = f["ymin"].value
    plot_curves(curves, summary["delta"], out / "pareto.png", title=f["title"].value,
                ylim=None if ymin is None else (ymin, 1.0))
    results.write_json(out / "pareto.json", summary)
    for label, row in summary["final"].items():
        print(f"{label}: test accuracy {row['test_accuracy_mean']:.4f} ± "
              f"{row['test_accuracy_std']:.4f} over {len(row['runs'])} run(s) at ε = "
              f"{row['epsilon']:.4g}, δ = {summary['delta']:g}")
    print(f"Wrote {out}/pareto.csv, pareto.json, pareto.png")


# `cli` is the console entry point tf-tempered-pareto-runs.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
