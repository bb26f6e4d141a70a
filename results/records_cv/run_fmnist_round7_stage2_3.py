"""Stages 2 and 3 of results/records_protocol.md's seventh Fashion-MNIST round (feature power
0.5 or 0.25).

The second round's rules and code (run_fmnist_round2_stage2_3.py) on the seventh round's
directories: stage 1 in results/records_cv/fashion_mnist_round7_stage1/runs/ (the base's 3 folds
copied from round 5's trial001, 2 candidates × 3 folds trained), stage 2 in
fashion_mnist_round7_stage2/, stage 3's runs in results/runs/fashion_mnist_best_round7_seed*/. From
a git worktree of a commit holding this file:

    PYTHONPATH=$PWD nice -n 19 python results/records_cv/run_fmnist_round7_stage2_3.py
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_fmnist_round2_stage2_3 as rounds  # noqa: E402

rounds.STAGE1 = rounds.ROOT / "results/records_cv/fashion_mnist_round7_stage1/runs"
rounds.STAGE2 = rounds.ROOT / "results/records_cv/fashion_mnist_round7_stage2"
rounds.ROUND = 7

if __name__ == "__main__":
    rounds.main()
