#!/usr/bin/env bash
# Stage 1 of results/records_protocol.md: both datasets' searches, one run at a time, resumable
# (a finished run is kept in <output_dir>/runs/ and not trained again). Run from a git worktree
# of the commit holding the protocol, at low priority, with its log:
#   git worktree add /work/wt-records <commit> && cd /work/wt-records && \
#     PYTHONPATH=$PWD nice -n 19 bash results/records_cv/run_stage1.sh > results/records_cv/stage1.log 2>&1
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
DATA=${DATA_DIR:-../shared/data}
$PY -m tf_tempered.experiments.search --recipe=best --dataset=fashion_mnist --data_dir="$DATA" \
    --validation_size=20000 --validation_folds=3 --seed=0 --search=one_at_a_time \
    --vary=ema_decay=0.99,0.999 --vary=augmult+augment_shift=4+1 --vary=weight_standardization=true \
    --vary=head=linear --vary=lr_schedule=cosine \
    --vary=batch_size+epochs+learning_rate=4096+80+8 \
    --output_dir=results/records_cv/fashion_mnist_stage1
$PY -m tf_tempered.experiments.search --recipe=best --dataset=mnist --data_dir="$DATA" \
    --validation_size=20000 --validation_folds=3 --seed=0 --search=one_at_a_time \
    --vary=ema_decay=0.99,0.999 --vary=lr_schedule=cosine \
    --vary=batch_size+epochs+learning_rate=2048+80+2 --vary=augmult=8 --vary=head=linear \
    --output_dir=results/records_cv/mnist_stage1
