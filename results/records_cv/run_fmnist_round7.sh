#!/usr/bin/env bash
# results/records_protocol.md's seventh Fashion-MNIST round: stage 1 (the base's runs copied from round
# 5's trial001, two candidates' 3 folds trained), then stages 2 and 3. From a git worktree of the commit
# holding the protocol section, at low priority, with its log:
#   cd <worktree> && PYTHONPATH=$PWD PYTHON=<python> nice -n 19 bash results/records_cv/run_fmnist_round7.sh \
#     >> results/records_cv/fashion_mnist_round7.log 2>&1
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
DATA=${DATA_DIR:-../shared/data}
OUT=results/records_cv/fashion_mnist_round7_stage1
mkdir -p $OUT/runs
for k in 0 1 2; do
  [ -f $OUT/runs/trial000_fold$k.json ] || \
    cp results/records_cv/fashion_mnist_round5_stage1/runs/trial001_fold$k.json $OUT/runs/trial000_fold$k.json
done
$PY -m tf_tempered.experiments.search --recipe=best --dataset=fashion_mnist --data_dir="$DATA" \
    --validation_size=20000 --validation_folds=3 --seed=0 --search=one_at_a_time \
    --vary=feature_power=0.5,0.25 --output_dir=$OUT
$PY results/records_cv/run_fmnist_round7_stage2_3.py
