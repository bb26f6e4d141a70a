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
"""Test accuracy over a grid of tempered sigmoids (s, T, o) at one privacy budget (Figure 2).

    python -m tf_tempered.experiments.sweep --dataset=mnist --epochs=15 \\
        --scales=1,2,3 --inverse_temperatures=1,2,4 --offsets=0,0.5,1,2 \\
        --output_dir=/tmp/sweep

Every triplet trains with the same σ, batch size and steps, hence the same ε. Each
run is stored as ``runs/s<s>_T<T>_o<o>.json`` in ``--output_dir``; a rerun skips the
triplets already there (resumable). Writes ``summary.csv`` (best first),
``summary.json`` (with the mean accuracy of the top 10% of triplets, the statistic
the paper reports) and ``sweep.png`` (one accuracy heatmap over s × T per offset).
"""

import itertools
import math
import pathlib

import numpy as np

from tf_tempered._plotting import agg_figure
from tf_tempered.experiments import command_line, common, results
from tf_tempered.experiments.run_report import progress_verbosity
from tf_tempered.experiments.train import run_training

__all__ = ["run_sweep", "top_fraction_mean", "define_flags", "main", "cli"]

_COLUMNS = ("scale", "inverse_temperature", "offset", "test_accuracy", "epsilon", "delta",
            "noise_multiplier", "steps", "wall_time_s", "run")


def top_fraction_mean(accuracies, fraction=0.1):
    """Mean of the best ``ceil(fraction · n)`` accuracies (at least one).

    >>> top_fraction_mean([0.1, 0.9, 0.5, 0.7], fraction=0.5)
    0.8
    """
    ranked = sorted(accuracies, reverse=True)
    if not ranked:
        raise ValueError("no accuracies to rank.")
    return float(np.mean(ranked[:max(1, math.ceil(fraction * len(ranked)))]))


def _run_name(s, t, o):
    return f"s{s:g}_T{t:g}_o{o:g}"


def run_sweep(base_config, *, scales, inverse_temperatures, offsets, output_dir, verbose=1):
    """Trains ``base_config`` with the tempered sigmoid at each (s, T, o) of the grid.

    Args:
        base_config: TrainConfig for every run; its activation settings are replaced.
        scales, inverse_temperatures, offsets: the grid's values (duplicates dropped).
        output_dir: where the runs, ``summary.csv``, ``summary.json`` and ``sweep.png`` go.
        verbose: as for :func:`run_training`.

    Returns:
        The summary dict (also ``summary.json``), with ``num_trained``: runs trained
        by this call (0 when everything was already in ``output_dir``).
    """
    if not output_dir:
        raise common.ConfigError("--output_dir is required for a sweep (it stores each run "
                                 "and makes the sweep resumable). Fix: pass --output_dir=DIR.")
    out = pathlib.Path(output_dir)
    grid = [tuple(float(v) for v in t) for t in itertools.product(
        *(dict.fromkeys(values) for values in (scales, inverse_temperatures, offsets)))]
    if not grid:
        raise common.ConfigError("the (s, T, o) grid is empty. Fix: give at least one value "
                                 "to each of --scales, --inverse_temperatures, --offsets.")
    runs = [(_run_name(s, t, o), base_config.replace(
        activation="tempered_sigmoid", scale=s, inverse_temperature=t, offset=o,
        output_dir=None)) for s, t, o in grid]
    by_name, trained = results.run_all(out / "runs", runs,
                                       lambda c: run_training(c, verbose=verbose),
                                       verbose=verbose)
    rows = []
    for (name, config), run in ((r, by_name[r[0]]) for r in runs):
        rows.append({"scale": config.scale, "inverse_temperature": config.inverse_temperature,
                     "offset": config.offset, "test_accuracy": run["test_accuracy"],
                     "epsilon": float(run["epsilon"]), "delta": run["delta"],
                     "noise_multiplier": run["noise_multiplier"], "steps": run["steps"],
                     "wall_time_s": run["wall_time_s"], "run": f"runs/{name}.json"})
    rows.sort(key=lambda r: -r["test_accuracy"])
    summary = {
        "num_runs": len(rows), "num_trained": trained,
        "top10_mean_accuracy": top_fraction_mean([r["test_accuracy"] for r in rows]),
        "best": rows[0],
        # Same σ and steps for every triplet, so one ε; a spread would flag mixed runs.
        "epsilon": max(r["epsilon"] for r in rows), "delta": base_config.delta,
        "grid": {"scales": sorted({r["scale"] for r in rows}),
                 "inverse_temperatures": sorted({r["inverse_temperature"] for r in rows}),
                 "offsets": sorted({r["offset"] for r in rows})},
        "runs": rows,
    }
    results.write_csv(out / "summary.csv", rows, _COLUMNS)
    _plot(rows, summary, out / "sweep.png")
    results.write_json(out / "summary.json", summary)
    if verbose:
        best = rows[0]
        print(f"{len(rows)} triplets ({trained} trained now) at ε = {summary['epsilon']:.4g}, "
              f"δ = {base_config.delta:g}: mean test accuracy of the top 10% "
              f"{summary['top10_mean_accuracy']:.4f}; best (s, T, o) = ({best['scale']:g}, "
              f"{best['inverse_temperature']:g}, {best['offset']:g}) with "
              f"{best['test_accuracy']:.4f}. Wrote {out}/summary.csv, summary.json, sweep.png",
              flush=True)
    return summary


def _plot(rows, summary, path):
    """One heatmap of test accuracy over (s, T) per offset o."""
    grid = summary["grid"]
    scales, temps, offsets = grid["scales"], grid["inverse_temperatures"], grid["offsets"]
    accuracy = {(r["scale"], r["inverse_temperature"], r["offset"]): r["test_accuracy"]
                for r in rows}
    figure, axes = agg_figure(
        1, len(offsets), figsize=(1.5 + max(2.2, 0.8 * len(temps)) * len(offsets),
                                  2.2 + 0.5 * len(scales)))
    values = [r["test_accuracy"] for r in rows]
    low, high = min(values), max(values)
    image = None
    for ax, o in zip(axes, offsets):
        table = np.array([[accuracy.get((s, t, o), np.nan) for t in temps] for s in scales])
        image = ax.imshow(table, vmin=low, vmax=high if high > low else low + 1e-6,
                          cmap="viridis", origin="lower", aspect="auto")
        for (i, j), value in np.ndenumerate(table):
            if not np.isnan(value):
                ax.text(j, i, f"{value:.3f}", ha="center", va="center", fontsize=7,
                        color="white" if value < (low + high) / 2 else "black")
        ax.set_xticks(range(len(temps)), [f"{t:g}" for t in temps])
        ax.set_yticks(range(len(scales)), [f"{s:g}" for s in scales])
        ax.set_xlabel("inverse temperature T")
        ax.set_title(f"offset o = {o:g}", fontsize=9)
    axes[0].set_ylabel("scale s")
    figure.colorbar(image, ax=axes, label="test accuracy")
    figure.suptitle(f"ε = {summary['epsilon']:.3g}, δ = {summary['delta']:g}; top-10% mean "
                    f"{summary['top10_mean_accuracy']:.3f}", fontsize=9)
    figure.savefig(path, format="png", dpi=120)


def define_flags():
    """Defines the sweep's absl flags: train's (minus the activation) plus the grid."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    command_line.define_training_flags(
        flags.FLAGS, exclude=("activation", "scale", "inverse_temperature", "offset",
                              "save_model"))
    flags.DEFINE_list("scales", ["1", "2", "3"], "Scales s of the grid.")
    flags.DEFINE_list("inverse_temperatures", ["1", "2", "4"], "Inverse temperatures T.")
    flags.DEFINE_list("offsets", ["0", "0.5", "1", "2"], "Offsets o.")


def _run_from_flags(f):
    grid = {name: command_line.parse_floats(name, f[name].value)
            for name in ("scales", "inverse_temperatures", "offsets")}
    config = command_line.config_from_flags(f, activation="tempered_sigmoid", output_dir=None)
    run_sweep(config, output_dir=f.output_dir, verbose=progress_verbosity(), **grid)


# `cli` is the console entry point tf-tempered-sweep.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
