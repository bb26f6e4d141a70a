#!/usr/bin/env bash
# Stages 2 and 3 of results/records_protocol.md for Fashion-MNIST, run once stage 1 is complete
# (from the worktree of the protocol's commit, at nice 19, one run at a time):
#   PYTHONPATH=$PWD PYTHON=<python> nice -n 19 bash results/records_cv/run_fmnist_stage2_3.sh
# Stage 2: from the base, the qualifying candidates in decreasing order of stage-1 gain: the linear
# head (+0.84) first; weight standardization (+0.30) cannot combine with it (a CNN setting); the
# larger batch (B = 4096, 80 epochs, lr 8) is tried on top of the linear head only if it qualified
# in stage 1 (≥ 0.10 over the base's mean), and kept only if ≥ 0.10 over the linear head's mean.
# Stage 3: the selected configuration, seeds 0, 1, 2, all 60,000 training examples, test set once.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
DATA=${DATA_DIR:-../shared/data}
S1=results/records_cv/fashion_mnist_stage1/runs
mean() { $PY -c "import json,sys; v=[json.load(open(f))['validation_accuracy'] for f in sys.argv[1:]]; assert len(v)==3, v; print(100*sum(v)/3)" "$@"; }
base=$(mean $S1/trial000_fold*.json); linear=$(mean $S1/trial005_fold*.json); big=$(mean $S1/trial007_fold*.json)
echo "stage 1 means: base $base, linear head $linear, B=4096 $big"
selected="--head=linear"
if $PY -c "import sys; sys.exit(0 if float('$big') >= float('$base') + 0.10 else 1)"; then
  echo "stage 2: B=4096 qualified; trying it on top of the linear head"
  $PY -m tf_tempered.experiments.search --recipe=best --dataset=fashion_mnist --data_dir="$DATA" \
      --head=linear --validation_size=20000 --validation_folds=3 --seed=0 --search=grid \
      --vary=batch_size+epochs+learning_rate=4096+80+8 \
      --output_dir=results/records_cv/fashion_mnist_stage2
  both=$(mean results/records_cv/fashion_mnist_stage2/runs/trial000_fold*.json)
  echo "stage 2: linear head + B=4096 $both against linear head $linear"
  if $PY -c "import sys; sys.exit(0 if float('$both') >= float('$linear') + 0.10 else 1)"; then
    selected="--head=linear --batch_size=4096 --epochs=80 --learning_rate=8"
  fi
else
  echo "stage 2: B=4096 did not qualify; the linear head alone is the selection"
fi
echo "selected: --recipe=best $selected"
for seed in 0 1 2; do
  out=results/runs/fashion_mnist_best_linear_seed$seed
  [ -f "$out/metrics.json" ] && { echo "seed $seed: done"; continue; }
  /usr/bin/time -v $PY -m tf_tempered.experiments.train --recipe=best $selected --dataset=fashion_mnist \
      --data_dir="$DATA" --seed=$seed --output_dir=$out --nosave_model 2> results/records_cv/stage3_fmnist_seed$seed.time
done
