#!/usr/bin/env bash
# Peak memory of each model's DP step with each layer's norms computed inside the backward
# pass (EngineOptions.norms_in_backward=True, the default) and after it (False), each
# configuration alone in its process, twice, against the non-private step (issue 30):
#   PYTHON=python bash benchmarks/norms_in_backward_memory.sh > benchmarks/results/norms_in_backward_memory_keras3.txt
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
for model in ${MODELS:-mnist cifar10 text lstm gru conv1d mobilenet lora}; do
  for r in 1 2; do
    $PY benchmarks/memory_alone.py $model nonprivate 2>/dev/null | sed "s/^/$model /"
    $PY benchmarks/memory_alone.py $model dp '{"norms_in_backward": true}' 2>/dev/null | sed "s/^/$model /"
    $PY benchmarks/memory_alone.py $model dp '{"norms_in_backward": false}' 2>/dev/null | sed "s/^/$model /"
  done
done
