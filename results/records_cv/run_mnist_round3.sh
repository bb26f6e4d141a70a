#!/usr/bin/env bash
# results/records_protocol.md's third MNIST round (the PLD accountant with EMA 0.99): stage 1 (the base's runs
# copied from the first MNIST stage 1, the candidate's 3 folds trained), then stages 2 and 3.
# From a git worktree of the commit holding the protocol section, at low priority, with its log:
#   cd <worktree> && PYTHONPATH=$PWD PYTHON=<python> nice -n 19 bash results/records_cv/run_mnist_round3.sh \
#     >> results/records_cv/mnist_round3.log 2>&1
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
DATA=${DATA_DIR:-../shared/data}
OUT=results/records_cv/mnist_round3_stage1
mkdir -p $OUT/runs
for k in 0 1 2; do
  [ -f $OUT/runs/trial000_fold$k.json ] || cp results/records_cv/mnist_stage1/runs/trial000_fold$k.json $OUT/runs/
done
$PY -m tf_tempered.experiments.search --recipe=best --dataset=mnist --data_dir="$DATA" \
    --validation_size=20000 --validation_folds=3 --seed=0 --search=one_at_a_time \
    --vary=accountant+ema_decay=pld+0.99 --output_dir=$OUT
$PY results/records_cv/run_mnist_round3_stage2_3.py
