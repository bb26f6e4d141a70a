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
"""Test accuracy against ε for ReLU and tanh with identical hyperparameters (Figure 3).

    python -m tf_tempered.experiments.pareto --dataset=mnist --epochs=40 \\
        --activations=relu,tanh --seeds=0,1,2 --output_dir=/tmp/pareto

Each (activation, seed) run records its test accuracy after every epoch together
with the ε spent so far; the curves average the accuracy over ``--seeds`` (every
seed spends the same ε per epoch). Runs are stored as ``runs/<activation>_seed<k>.json``
(a rerun resumes); writes ``pareto.csv``, ``pareto.json`` and ``pareto.png``.
"""

import pathlib

import numpy as np

from tf_tempered._plotting import agg_figure
from tf_tempered.experiments import command_line, common, results
from tf_tempered.experiments.run_report import progress_verbosity
from tf_tempered.experiments.train import run_training

__all__ = ["run_pareto", "define_flags", "main", "cli"]

_COLUMNS = ("activation", "epoch", "steps", "epsilon", "test_accuracy_mean",
            "test_accuracy_std", "num_seeds")
_LABELS = {"relu": "ReLU", "tanh": "tanh", "tempered_sigmoid": "tempered sigmoid"}


def run_pareto(base_config, *, activations=("relu", "tanh"), seeds=(0, 1, 2), output_dir,
               verbose=1):
    """Trains ``base_config`` with each activation and seed; returns the curves (also saved).

    Args:
        base_config: TrainConfig shared by every run (must be DP-SGD); its activation
            and seed are replaced (a tempered sigmoid keeps the config's (s, T, o)).
        activations: among "relu", "tanh", "tempered_sigmoid".
        seeds: one run per seed and activation; accuracies are averaged over them.
        output_dir: where the runs, ``pareto.csv``, ``pareto.json`` and ``pareto.png`` go.
        verbose: as for :func:`run_training`.

    Returns:
        ``{"curves": {activation: [row per epoch]}, "final": ..., "num_trained": ...}``.
    """
    if not output_dir:
        raise common.ConfigError("--output_dir is required (it stores each run, so a rerun "
                                 "resumes). Fix: pass --output_dir=DIR.")
    if not base_config.dpsgd:
        raise common.ConfigError("the ε-accuracy curve needs DP-SGD, but --nodpsgd was "
                                 "given (ε = inf). Fix: drop --nodpsgd.")
    activations, seeds = list(dict.fromkeys(activations)), list(dict.fromkeys(seeds))
    if not activations or not seeds:
        raise common.ConfigError("give at least one of --activations and of --seeds, e.g. "
                                 "--activations=relu,tanh --seeds=0,1,2.")
    for activation in activations:
        if activation not in common.ACTIVATIONS:
            raise common.ConfigError(f"--activations: {activation!r} is not one of "
                                     f"{', '.join(common.ACTIVATIONS)}.")
    runs = []
    for activation in activations:
        changes = {} if activation == "tempered_sigmoid" else dict(
            scale=2.0, inverse_temperature=2.0, offset=1.0, learnable=False)
        for seed in seeds:
            runs.append(((activation, seed), base_config.replace(
                activation=activation, seed=seed, output_dir=None, **changes)))
    out = pathlib.Path(output_dir)
    named = [(f"{a}_seed{s}", config) for (a, s), config in runs]
    by_name, trained = results.run_all(out / "runs", named,
                                       lambda c: run_training(c, verbose=verbose),
                                       verbose=verbose)
    curves, final, rows = {}, {}, []
    for activation in activations:
        histories = [by_name[f"{activation}_seed{s}"]["history"] for s in seeds]
        epochs = min(len(h) for h in histories)  # equal unless a budget stopped one early
        curve = []
        for e in range(epochs):
            accuracies = np.array([h[e]["test_accuracy"] for h in histories])
            curve.append({"activation": activation, "epoch": histories[0][e]["epoch"],
                          "steps": histories[0][e]["steps"],
                          "epsilon": float(histories[0][e]["epsilon"]),
                          "test_accuracy_mean": float(accuracies.mean()),
                          "test_accuracy_std": float(accuracies.std()),
                          "num_seeds": len(seeds)})
        curves[activation] = curve
        rows.extend(curve)
        finals = [by_name[f"{activation}_seed{s}"]["test_accuracy"] for s in seeds]
        final[activation] = {"test_accuracy_mean": float(np.mean(finals)),
                             "test_accuracy_std": float(np.std(finals)),
                             "epsilon": curve[-1]["epsilon"] if curve else None}
    summary = {"curves": curves, "final": final, "delta": base_config.delta,
               "seeds": seeds, "num_trained": trained,
               "runs": {name: f"runs/{name}.json" for name, _ in named}}
    results.write_csv(out / "pareto.csv", rows, _COLUMNS)
    _plot(curves, base_config.delta, out / "pareto.png")
    results.write_json(out / "pareto.json", summary)
    if verbose:
        for activation, f in final.items():
            print(f"{_LABELS[activation]}: test accuracy {f['test_accuracy_mean']:.4f} ± "
                  f"{f['test_accuracy_std']:.4f} over {len(seeds)} seed(s) at ε = "
                  f"{f['epsilon']:.4g}, δ = {base_config.delta:g}", flush=True)
        print(f"Wrote {out}/pareto.csv, pareto.json, pareto.png", flush=True)
    return summary


def _plot(curves, delta, path):
    figure, (ax,) = agg_figure(figsize=(5, 3.5))
    for activation, curve in curves.items():
        eps = [r["epsilon"] for r in curve]
        mean = np.array([r["test_accuracy_mean"] for r in curve])
        std = np.array([r["test_accuracy_std"] for r in curve])
        ax.plot(eps, mean, marker="o", markersize=3, label=_LABELS[activation])
        ax.fill_between(eps, mean - std, mean + std, alpha=0.2)
    ax.set_xlabel(f"ε (δ = {delta:g})")
    ax.set_ylabel("test accuracy")
    ax.set_title("Test accuracy vs privacy budget")
    ax.legend()
    figure.savefig(path, format="png", dpi=120)


def define_flags():
    """Defines the script's absl flags: train's (minus activation and seed) plus the lists."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    command_line.define_training_flags(flags.FLAGS, exclude=("activation", "seed", "dpsgd",
                                                       "save_model"))
    flags.DEFINE_list("activations", ["relu", "tanh"], "Activations to compare.")
    flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; accuracy is averaged over them.")


def _run_from_flags(f):
    try:
        seeds = [int(s) for s in f.seeds]
    except ValueError as e:
        raise common.ConfigError(f"--seeds={','.join(f.seeds)} is invalid: give "
                                 "comma-separated integers, e.g. --seeds=0,1,2.") from e
    # The tempered sigmoid's (s, T, o) flags apply only if it is among --activations.
    config = command_line.config_from_flags(f, activation="tempered_sigmoid", output_dir=None)
    run_pareto(config, activations=f.activations, seeds=seeds, output_dir=f.output_dir,
               verbose=progress_verbosity())


# `cli` is the console entry point tf-tempered-pareto.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
