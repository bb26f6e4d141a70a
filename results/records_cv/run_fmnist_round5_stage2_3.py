"""Stages 2 and 3 of results/records_protocol.md's fifth Fashion-MNIST round (the linear head,
the PLD accountant, B = 1024).

The second round's rules and code (run_fmnist_round2_stage2_3.py) on the fifth round's
directories: stage 1 in results/records_cv/fashion_mnist_round5_stage1/runs/ (3 trials × 3
folds), stage 2 in fashion_mnist_round5_stage2/, stage 3's runs in
results/runs/fashion_mnist_best_round5_seed*/. From a git worktree of a commit holding this file:

    PYTHONPATH=$PWD nice -n 19 python results/records_cv/run_fmnist_round5_stage2_3.py
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_fmnist_round2_stage2_3 as rounds  # noqa: E402

rounds.STAGE1 = rounds.ROOT / "results/records_cv/fashion_mnist_round5_stage1/runs"
rounds.STAGE2 = rounds.ROOT / "results/records_cv/fashion_mnist_round5_stage2"
rounds.ROUND = 5

if __name__ == "__main__":
    rounds.main()
