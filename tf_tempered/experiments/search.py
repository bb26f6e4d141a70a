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
"""Hyperparameter search at a fixed ε, selected on a validation split (never the test set).

    python -m tf_tempered.experiments.search --dataset=mnist --target_epsilon=2.93 \\
        --validation_size=5000 --epochs=40 --vary=learning_rate=2,4 \\
        --vary=l2_norm_clip=0.1,1 --vary=activation=tanh,ts:2/2/1,ts_learnable:2/2/1 \\
        --vary=ema_decay=none,0.999 --search=grid --output_dir=/tmp/search

Every train flag sets the base config; each ``--vary=FLAG=V1,V2,...`` makes FLAG an
axis (values parsed as the flag's type; ``none`` for unset). ``activation`` also takes
``ts:S/T/O`` (tempered sigmoid with scale S, inverse temperature T, offset O) and
``ts_learnable:S/T/O`` (the same, learnable per layer); ``--vary=F1+F2=a1+a2,b1+b2``
is one joint axis (flags that change together, e.g. batch size with epochs).
``--search=grid`` trains every combination; ``--search=random`` trains ``--num_trials``
of them drawn without replacement with ``--search_seed`` (a public seed: which configs
are tried is not privacy-relevant); ``--search=one_at_a_time`` trains the base config
and each axis value alone on it (an ablation: each candidate against the same base). σ is always calibrated with ``--target_epsilon``, so every run ends
at that ε (at ``--delta``) on the N − ``--validation_size`` training examples it uses.

Selection is by validation accuracy. ``--validation_folds=K`` (K ≥ 2) makes it K-fold
cross-validation: each config is trained K times, holding out block k of
``--validation_size`` examples (``--validation_fold=k``, k = 0..K−1; e.g. 12000 × 5
for MNIST's 60,000), and scored by the mean of the K validation accuracies. The test
set is evaluated by run_training at the end of every run but dropped here (not stored,
not shown), so the search cannot select on it. Writes ``runs/<trial>.json``
(resumable, as the sweep), ``search.csv``, ``search.json`` and ``search.md`` (one row
per config, best marked), and prints the command that re-runs the best config with
its test-set evaluation.

Privacy of the search itself: see docs/model_selection.md. The reported ε covers one
training run; the selection, made on validation data carved from the private training
set, has its own cost (Papernot & Steinke 2022) that this ε does not include.
"""

import pathlib
import shlex

import numpy as np

from tf_tempered.experiments import command_line, common, results
from tf_tempered.experiments.run_report import progress_verbosity
# The search space (search_space.py), re-exported: this script's API.
from tf_tempered.experiments.search_space import expand_trials, parse_axis
from tf_tempered.experiments.train import run_training

__all__ = ["parse_axis", "expand_trials", "run_search", "best_command", "define_flags",
           "main", "cli"]

def _check_base(config, folds):
    if not config.dpsgd or config.target_epsilon is None or config.noise_multiplier is not None:
        raise common.ConfigError(
            "the search needs --target_epsilon (σ calibrated so every run ends at that ε) and "
            "DP training. Fix: pass e.g. --target_epsilon=2.93 and no --noise_multiplier or "
            "--nodpsgd.")
    if not config.validation_size:
        raise common.ConfigError(
            "the search selects on a validation split, never the test set: --validation_size "
            "must be > 0. Fix: pass e.g. --validation_size=5000 (MNIST, Fashion-MNIST) or "
            "--validation_size=300 (digits).")
    if isinstance(folds, bool) or not isinstance(folds, int) or folds < 1:
        raise common.ConfigError(f"--validation_folds={folds!r} is invalid: it must be an "
                                 "integer >= 1 (1: one split). Fix: e.g. --validation_folds=5.")
    if folds > 1 and config.validation_fold is not None:
        raise common.ConfigError(
            f"--validation_folds={folds} runs every fold itself; --validation_fold="
            f"{config.validation_fold} would pin one. Fix: drop --validation_fold.")


def _without_test(result):
    """The run's result minus the test-set numbers, which the search must not see."""
    return {k: v for k, v in dict(result).items() if not k.startswith("test_")}


def best_command(config, output_dir="results/best"):
    """The train command that re-runs ``config`` (flags differing from the defaults).

    ``config`` holds resolved values, so ``--recipe`` is left out: with it, a value equal
    to the script's default but not to the recipe's (e.g. ``--activation=tempered_sigmoid``
    over ``--recipe=best``'s tanh) would be dropped and the recipe's used instead.
    """
    defaults = common.TrainConfig()
    args = []
    for name, value in config.replace(output_dir=output_dir,
                                      save_model=True).to_dict().items():
        if name == "recipe":
            continue
        if value == getattr(defaults, name) and name != "dataset":  # always say which data
            continue
        if isinstance(value, bool):
            args.append(f"--{name}" if value else f"--no{name}")
        elif value is not None:
            args.append(f"--{name}={value:g}" if isinstance(value, float) else f"--{name}={value}")
    return " ".join(["python -m tf_tempered.experiments.train"] + [shlex.quote(a) for a in args])


_COLUMNS = ("best", "trial", "validation_accuracy", "fold_accuracies", "epsilon", "delta",
            "noise_multiplier", "steps", "wall_time_s", "changes")


def run_search(base_config, axes, *, output_dir, search="grid", num_trials=None, seed=0,
               folds=1, verbose=1, run=None):
    """Trains each trial of :func:`expand_trials`; returns the summary (also search.json).

    ``folds`` ≥ 2: each trial once per fold k (``validation_fold=k``), scored by the
    mean validation accuracy. ``run(config) -> metrics`` defaults to
    :func:`run_training`; the test-set entries of its result are dropped before
    anything is stored or compared.
    """
    _check_base(base_config, folds)
    if not output_dir:
        raise common.ConfigError("--output_dir is required for a search (it stores each run "
                                 "and makes the search resumable). Fix: pass --output_dir=DIR.")
    out = pathlib.Path(output_dir)
    trials = expand_trials(base_config.replace(output_dir=None), axes, search=search,
                           num_trials=num_trials, seed=seed)
    fold_ids = [None] if folds == 1 else list(range(folds))
    runs = [(f"trial{i:03d}" + ("" if k is None else f"_fold{k}"),
             config if k is None else config.replace(validation_fold=k))
            for i, (_, config) in enumerate(trials) for k in fold_ids]
    # verbose=0: run_training's own summary line shows the test accuracy.
    train = run or (lambda c: run_training(c, verbose=0))

    def run_one(config):
        result = _without_test(train(config))
        if verbose:
            print(f"  validation accuracy {result['validation_accuracy']:.4f}, ε = "
                  f"{float(result['epsilon']):.4g}", flush=True)
        return result

    by_name, trained = results.run_all(out / "runs", runs, run_one, verbose=verbose)
    rows = []
    for i, (changes, _) in enumerate(trials):
        per_fold = [by_name[name] for name, _ in runs[i * len(fold_ids):(i + 1) * len(fold_ids)]]
        accuracies = [r["validation_accuracy"] for r in per_fold]
        rows.append({"trial": f"trial{i:03d}",
                     "validation_accuracy": float(np.mean(accuracies)),
                     "fold_accuracies": " ".join(f"{a:.4f}" for a in accuracies)
                                        if folds > 1 else "",
                     "epsilon": max(float(r["epsilon"]) for r in per_fold),
                     "delta": per_fold[0]["delta"],
                     "noise_multiplier": per_fold[0]["noise_multiplier"],
                     "steps": per_fold[0]["steps"],
                     "wall_time_s": sum(r["wall_time_s"] for r in per_fold),
                     "changes": " ".join(f"{k}={v}" for k, v in changes.items()) or "(base)"})
    best = max(range(len(rows)), key=lambda i: rows[i]["validation_accuracy"])
    for i, row in enumerate(rows):
        row["best"] = "*" if i == best else ""
    command = best_command(trials[best][1])
    summary = {"num_trials": len(rows), "num_trained": trained, "search": search,
               "selection": "validation_accuracy", "target_epsilon": base_config.target_epsilon,
               "delta": base_config.delta, "validation_size": base_config.validation_size,
               "validation_folds": folds,
               "best": rows[best], "best_command": command, "rows": rows,
               "privacy_note": ("each run's ε covers that run only; the selection over "
                                f"{len(rows)} runs on validation data carved from the training "
                                "set is not accounted (docs/model_selection.md).")}
    results.write_csv(out / "search.csv", rows, _COLUMNS)
    results.write_json(out / "search.json", summary)
    (out / "search.md").write_text(_markdown(rows, summary))
    if verbose:
        print(f"{len(rows)} configs ({trained} trained now) at ε = {base_config.target_epsilon}"
              f", δ = {base_config.delta:g}; best validation accuracy "
              f"{rows[best]['validation_accuracy']:.4f} ({rows[best]['changes']}). Wrote "
              f"{out}/search.csv, search.json, search.md. Re-run the best config with its "
              f"test-set evaluation:\n  {command}", flush=True)
    return summary


def _markdown(rows, summary):
    folds = summary["validation_folds"]
    where = (f"{summary['validation_size']} validation examples" if folds == 1 else
             f"the mean of {folds} folds of {summary['validation_size']} validation examples")
    lines = [f"Search at ε = {summary['target_epsilon']}, δ = {summary['delta']:g}, selected "
             f"on {where} (best marked *).", "",
             "| best | trial | validation accuracy | per fold | ε | σ | changes |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['best']} | {r['trial']} | {r['validation_accuracy']:.4f} | "
              f"{r['fold_accuracies'] or '–'} | {r['epsilon']:.4g} | "
              f"{r['noise_multiplier']:.4g} | {r['changes']} |" for r in rows]
    lines += ["", f"Re-run the best config: `{summary['best_command']}`", "",
              f"Privacy: {summary['privacy_note']}", ""]
    return "\n".join(lines)


def define_flags():
    """Defines the search's absl flags: every train flag (the base config) plus the axes."""
    from absl import flags  # pylint: disable=g-import-not-at-top
    command_line.define_training_flags(flags.FLAGS, exclude=("save_model",))
    flags.DEFINE_multi_string("vary", [], "FLAG=V1,V2,...: an axis of the search (repeat "
                              "for more axes); activation also takes ts:S/T/O and "
                              "ts_learnable:S/T/O; 'none' unsets; F1+F2=a1+a2,b1+b2 is "
                              "one joint axis.")
    flags.DEFINE_enum("search", "grid", ["grid", "random", "one_at_a_time"],
                      "grid: every combination; random: --num_trials of them drawn with "
                      "--search_seed; one_at_a_time: the base config and each value alone "
                      "on it (an ablation).")
    flags.DEFINE_integer("num_trials", None, "Configs to draw with --search=random.")
    flags.DEFINE_integer("search_seed", 0, "Seed of the random search (public).")
    flags.DEFINE_integer("validation_folds", 1, "K >= 2: K-fold cross-validation, each "
                         "config trained once per block of --validation_size examples "
                         "(--validation_fold=0..K-1) and scored by the mean accuracy.")


def _run_from_flags(f):
    config = command_line.config_from_flags(f, save_model=False)
    axes = [parse_axis(spec) for spec in f["vary"].value]
    run_search(config, axes, output_dir=f["output_dir"].value, search=f["search"].value,
               num_trials=f["num_trials"].value, seed=f["search_seed"].value,
               folds=f["validation_folds"].value,
               verbose=progress_verbosity())


# `cli` is the console entry point tf-tempered-search.
main, cli = command_line.absl_entry_point(define_flags, _run_from_flags)

if __name__ == "__main__":
    cli()
