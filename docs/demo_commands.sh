#!/usr/bin/env bash
# Reduced-scale MNIST demos of the sweep (Figure 2) and pareto (Figure 3) scripts; outputs in docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
$PY -m tf_tempered.experiments.sweep --dataset=mnist --data_dir=../shared/data --num_train=10000 --num_test=2000 \
  --epochs=5 --batch_size=256 --learning_rate=0.5 --noise_multiplier=1.1 \
  --scales=1,2,4 --inverse_temperatures=1,2 --offsets=0,1 --output_dir=docs/sweep_mnist_small
$PY -m tf_tempered.experiments.pareto --dataset=mnist --data_dir=../shared/data --num_train=10000 --num_test=2000 \
  --epochs=8 --batch_size=256 --learning_rate=0.5 --noise_multiplier=1.1 \
  --activations=relu,tanh --seeds=0,1 --output_dir=docs/pareto_mnist_small
