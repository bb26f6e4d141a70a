#!/usr/bin/env bash
# Regenerates benchmarks/results/*.md|json (the README's tables). CPU-only; ~10 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=benchmarks/results
$PY benchmarks/dp_step.py --model=mnist --batch_size=256 --json=$out/mnist_b256.json | tee $out/mnist_b256.md
$PY benchmarks/dp_step.py --model=mnist --batch_size=4096 --paths=nonprivate,tf_tempered --steps=3 --json=$out/mnist_b4096.json | tee $out/mnist_b4096.md
$PY benchmarks/dp_step.py --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered --steps=3 --json=$out/cifar10_b256.json | tee $out/cifar10_b256.md
# The batch size unknown while tracing: what model.fit(x, y, batch_size=...) on arrays runs after a short last batch.
$PY benchmarks/dp_step.py --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --dynamic_batch --json=$out/mnist_b256_dynamic.json | tee $out/mnist_b256_dynamic.md
$PY benchmarks/dp_step.py --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered --steps=3 --dynamic_batch --json=$out/cifar10_b256_dynamic.json | tee $out/cifar10_b256_dynamic.md
# The machine is noisy: the batch-256 comparison again, six times.
{
  echo "# Repeats of the MNIST batch-256 comparison (noisy shared 2-core machine)"; echo
  echo 'Command: `for i in 1 2 3 4 5 6; do python benchmarks/dp_step.py --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15; done`'; echo
  for i in 1 2 3 4 5 6; do
    $PY benchmarks/dp_step.py --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15 2>/dev/null \
      | grep -E '^\| (non|tf_)|^\| path|^\|---'
    echo
  done
} > $out/mnist_b256_repeats.md
