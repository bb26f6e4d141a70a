"""Stage 3 of results/records_protocol.md's third MNIST round (the PLD accountant with EMA 0.99).

The second Fashion-MNIST round's rules and code (run_fmnist_round2_stage2_3.py) on MNIST: stage 1
in results/records_cv/mnist_round3_stage1/runs/ (the base's 3 folds copied from the first MNIST
stage 1, the candidate's 3 trained), stage 2 in mnist_round3_stage2/ (one candidate: nothing to
combine), stage 3's runs in results/runs/mnist_best_round3_seed*/. From a git worktree of a
commit holding this file:

    PYTHONPATH=$PWD nice -n 19 python results/records_cv/run_mnist_round3_stage2_3.py
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import run_fmnist_round2_stage2_3 as rounds  # noqa: E402

rounds.STAGE1 = rounds.ROOT / "results/records_cv/mnist_round3_stage1/runs"
rounds.STAGE2 = rounds.ROOT / "results/records_cv/mnist_round3_stage2"
rounds.ROUND = 3
rounds.DATASET, rounds.SHORT = "mnist", "mnist"

if __name__ == "__main__":
    rounds.main()
