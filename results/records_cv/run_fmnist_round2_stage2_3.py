"""Stages 2 and 3 of results/records_protocol.md's second Fashion-MNIST round (the linear head).

Run once its stage 1 is complete (results/records_cv/fashion_mnist_linear_stage1/runs/, 7 trials
× 3 folds), from a git worktree of a commit holding this file, at nice 19, one run at a time:

    PYTHONPATH=$PWD nice -n 19 python results/records_cv/run_fmnist_round2_stage2_3.py

Stage 2 (the protocol: "+0.10 points over the configuration extended; the qualifiers added in
decreasing order of gain"): a stage-1 candidate qualifies with a mean validation accuracy
≥ 0.10 points over the base's. The first qualifier is the configuration (its stage-1 mean is
its score). Each next qualifier is added to it and trained on the same 3 folds and seed; it is
kept if that mean is ≥ 0.10 points over the current configuration's score. A qualifier that sets
a flag the configuration already sets (learning rate 2 or 8 after the other; B = 4096's
epochs and learning rate after 60 epochs or another learning rate) is skipped: the larger
gain already chose that flag. This conflict rule was written on 2026-11-27 after stage 1's
first five runs had been seen (the base's 3 folds, EMA's folds 0 and 1); it does not depend
on them.

Stage 3: the selection, seeds 0, 1, 2, all 60,000 training examples, test set once, each run's
wall time and peak memory by /usr/bin/time -v. Resumable: finished runs are not trained again.
"""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
STAGE1 = ROOT / "results/records_cv/fashion_mnist_linear_stage1/runs"
STAGE2 = ROOT / "results/records_cv/fashion_mnist_linear_stage2"
ROUND = 2  # names stage 3's runs; run_fmnist_round3_stage2_3.py sets these for round 3
DATASET, SHORT = "fashion_mnist", "fmnist"  # run_mnist_round2_stage2_3.py: MNIST's
DATA = "../shared/data"
THRESHOLD = 0.10  # points of validation accuracy
# Flags that differ between folds or runs, not between candidates.
RUN_FLAGS = ("validation_fold", "output_dir", "save_model", "data_dir")


def mean_accuracy(paths):
    values = [json.loads(p.read_text())["validation_accuracy"] for p in paths]
    if len(values) != 3:
        raise SystemExit(f"expected 3 folds, found {len(values)}: {[str(p) for p in paths]}")
    return 100 * sum(values) / 3


def stage1_candidates():
    """{trial: (mean %, {flag: value} changed from the base)} of stage 1."""
    trials = sorted({p.name.split("_fold")[0] for p in STAGE1.glob("trial*_fold*.json")})
    flags = {t: json.loads((STAGE1 / f"{t}_fold0.json").read_text())["flags"] for t in trials}
    base = flags["trial000"]
    return {t: (mean_accuracy(sorted(STAGE1.glob(f"{t}_fold*.json"))),
                {k: v for k, v in flags[t].items() if k not in RUN_FLAGS and base.get(k) != v})
            for t in trials}


def as_flags(changes):
    return [f"--{k}={v}" for k, v in sorted(changes.items())]


def search_command():
    return [sys.executable, "-m", "tf_tempered.experiments.search", "--recipe=best",
            f"--dataset={DATASET}", f"--data_dir={DATA}", "--validation_size=20000",
            "--validation_folds=3", "--seed=0", "--search=one_at_a_time"]


def stage2_score(name, changes):
    """Mean validation accuracy of the configuration ``changes`` over the 3 folds (trained
    by the search tool into its own directory, resumable)."""
    out = STAGE2 / name
    subprocess.run(search_command() + as_flags(changes) + [f"--output_dir={out}"], check=True, cwd=ROOT)
    return mean_accuracy(sorted((out / "runs").glob("trial000_fold*.json")))


def select():
    candidates = stage1_candidates()
    base_mean = candidates.pop("trial000")[0]
    print(f"stage 1: base {base_mean:.2f}")
    for trial, (score, changes) in candidates.items():
        print(f"  {trial} {changes}: {score:.2f} ({score - base_mean:+.2f})")
    qualifiers = sorted(((score - base_mean, trial, changes)
                         for trial, (score, changes) in candidates.items()
                         if score - base_mean >= THRESHOLD - 1e-9), key=lambda q: -q[0])
    selected, current = {}, base_mean
    for gain, trial, changes in qualifiers:
        if set(changes) & set(selected):
            print(f"stage 2: {trial} {changes} skipped: sets a flag the selection sets")
        elif not selected:
            selected, current = dict(changes), base_mean + gain
            print(f"stage 2: start from {trial} {changes}: {current:.2f}")
        else:
            extended = {**selected, **changes}
            score = stage2_score("_".join(sorted(extended)), extended)
            keep = score >= current + THRESHOLD - 1e-9
            print(f"stage 2: + {trial} {changes}: {score:.2f} against {current:.2f}: "
                  f"{'kept' if keep else 'not kept'}")
            if keep:
                selected, current = extended, score
    print(f"selected: --recipe=best {' '.join(as_flags(selected)) or '(the base)'}, "
          f"validation {current:.2f}")
    return selected


def stage3(selected):
    for seed in (0, 1, 2):
        out = ROOT / f"results/runs/{DATASET}_best_round{ROUND}_seed{seed}"
        if (out / "metrics.json").exists():
            print(f"seed {seed}: done")
            continue
        cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "tf_tempered.experiments.train",
               "--recipe=best", f"--dataset={DATASET}", f"--data_dir={DATA}",
               *as_flags(selected), f"--seed={seed}", f"--output_dir={out}", "--nosave_model"]
        print(" ".join(cmd[2:]), flush=True)
        timing = ROOT / f"results/records_cv/stage3_{SHORT}_round{ROUND}_seed{seed}.time"
        with open(timing, "w") as err:
            subprocess.run(cmd, check=True, cwd=ROOT, stderr=err)


def main():
    """Stage 2, then stage 3 of the selection; none when nothing qualified (the recipe stays:
    the protocol reports the stage-1 scores instead)."""
    selected = select()
    if not selected:
        print("nothing qualified: no stage 3, the recipe stays")
        return
    stage3(selected)


if __name__ == "__main__":
    main()
