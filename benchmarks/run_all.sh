#!/usr/bin/env bash
# Regenerates benchmarks/results/*.md|json (the tables of docs/benchmarks.md) and summary.md, the
# table of every dp_step.py row. CPU-only; ~40 min on 2 cores. PEERS_PYTHON=<python with the
# [peers] extra> adds the Opacus and JAX steps (benchmarks/peers/) to the same run.
# Each command names its Keras (--keras=2|3), whatever TF_USE_LEGACY_KERAS says; the unsuffixed
# files are Keras 2 (with TF Privacy's paths), the *_keras3* ones Keras 3.
# OUT=<folder> writes every file there instead (e.g. one host's whole run beside the files the
# docs cite).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=${OUT:-benchmarks/results}
mkdir -p "$out"
$PY benchmarks/dp_step.py --keras=2 --model=mnist --batch_size=256 --json=$out/mnist_b256.json | tee $out/mnist_b256.md
$PY benchmarks/dp_step.py --keras=2 --model=mnist --batch_size=4096 --paths=nonprivate,tf_tempered --steps=3 --json=$out/mnist_b4096.json | tee $out/mnist_b4096.md
$PY benchmarks/dp_step.py --keras=2 --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered --steps=3 --json=$out/cifar10_b256.json | tee $out/cifar10_b256.md
# tf-keras' LocallyConnected2D/1D (Keras 3 has none).
$PY benchmarks/dp_step.py --keras=2 --model=locally_connected --paths=nonprivate,tf_tempered --rounds=5 --json=$out/locally_connected_b256.json | tee $out/locally_connected_b256.md
# The batch size unknown while tracing: what model.fit(x, y, batch_size=...) on arrays runs after a short last batch.
$PY benchmarks/dp_step.py --keras=2 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --dynamic_batch --json=$out/mnist_b256_dynamic.json | tee $out/mnist_b256_dynamic.md
$PY benchmarks/dp_step.py --keras=2 --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered --steps=3 --dynamic_batch --json=$out/cifar10_b256_dynamic.json | tee $out/cifar10_b256_dynamic.md
# The machine is noisy: the batch-256 comparison again, six times.
{
  echo "# Repeats of the MNIST batch-256 comparison (noisy shared 2-core machine)"; echo
  echo 'Command: `for i in 1 2 3 4 5 6; do python benchmarks/dp_step.py --keras=2 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15; done`'; echo
  for i in 1 2 3 4 5 6; do
    $PY benchmarks/dp_step.py --keras=2 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15 2>/dev/null \
      | grep -E '^\| (non|tf_)|^\| path|^\|---'
    echo
  done
} > $out/mnist_b256_repeats.md
# Keras 3 (the default Keras): the same step, non-private vs tf_tempered vs TF ops only.
$PY benchmarks/dp_step.py --keras=3 --model=mnist --batch_size=256 --json=$out/mnist_b256_keras3.json | tee $out/mnist_b256_keras3.md
$PY benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 --steps=3 --json=$out/cifar10_b256_keras3.json | tee $out/cifar10_b256_keras3.md
# The machine is noisy: the Keras 3 batch-256 comparison again, four times.
{
  echo "# Repeats of the MNIST batch-256 comparison on Keras 3 (noisy shared 2-core machine)"; echo
  echo 'Command: `for i in 1 2 3 4; do python benchmarks/dp_step.py --keras=3 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15; done`'; echo
  for i in 1 2 3 4; do
    $PY benchmarks/dp_step.py --keras=3 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered --rounds=15 2>/dev/null \
      | grep -E '^mnist|^\| (non|tf_)|^\| path|^\|---'
    echo
  done
} > $out/mnist_b256_keras3_repeats.md
# Keras 3 vs Keras 2 (one Keras per process): alternating fresh processes K3, K2, K3, K2, ...
$PY benchmarks/keras_versions.py --model=mnist --batch_size=256 --processes=5 --json=$out/mnist_b256_keras3_vs_keras2.json | tee $out/mnist_b256_keras3_vs_keras2.md
$PY benchmarks/keras_versions.py --model=cifar10 --batch_size=256 --processes=3 --steps=3 --rounds=3 --json=$out/cifar10_b256_keras3_vs_keras2.json | tee $out/cifar10_b256_keras3_vs_keras2.md
# (results/*_run1.md, *_run2.*, *_run3.*: further runs of these commands on 2026-11-23 (MNIST run1 with --processes=4); see keras3_summary.md)
# Issue 14's rows (Keras 3): the text classifier, Conv1D, MobileNet-style and LSTM models, with the path each
# layer took; CIFAR-10 with EngineOptions.low_memory() as well.
$PY benchmarks/dp_step.py --keras=3 --model=text --paths=nonprivate,tf_tempered --rounds=5 --json=$out/text_b256_keras3.json | tee $out/text_b256_keras3.md
$PY benchmarks/dp_step.py --keras=3 --model=conv1d --paths=nonprivate,tf_tempered --rounds=5 --json=$out/conv1d_b256_keras3_run_all.json | tee $out/conv1d_b256_keras3_run_all.md
$PY benchmarks/dp_step.py --keras=3 --model=mobilenet --paths=nonprivate,tf_tempered --rounds=5 --json=$out/mobilenet_b256_keras3_run_all.json | tee $out/mobilenet_b256_keras3_run_all.md
$PY benchmarks/dp_step.py --keras=3 --model=lstm --paths=nonprivate,tf_tempered --steps=2 --rounds=5 --json=$out/lstm_b256_keras3_run_all.json | tee $out/lstm_b256_keras3_run_all.md
$PY benchmarks/dp_step.py --keras=3 --model=gru --paths=nonprivate,tf_tempered --steps=2 --rounds=5 --json=$out/gru_b256_keras3.json | tee $out/gru_b256_keras3.md
$PY benchmarks/dp_step.py --keras=3 --model=gru_reset_before --paths=nonprivate,tf_tempered --steps=2 --rounds=5 --json=$out/gru_reset_before_b256_keras3.json | tee $out/gru_reset_before_b256_keras3.md
# Issue 30's rows: LoRA fine-tuning (rank-4 LoRA on a 2-block transformer, batch 64) and the XLA-compiled steps
# (jit_compile=True: the TF-ops paths, what a GPU runs), each against the non-private step compiled the same way.
$PY benchmarks/dp_step.py --keras=3 --model=lora --paths=nonprivate,tf_tempered --rounds=5 --json=$out/lora_b64_keras3.json | tee $out/lora_b64_keras3.md
$PY benchmarks/dp_step.py --keras=3 --model=mnist --batch_size=256 --paths=nonprivate,tf_tempered,tf_tempered_tf_ops --jit_compile --rounds=5 --json=$out/mnist_b256_keras3_xla.json | tee $out/mnist_b256_keras3_xla.md
# The CIFAR-10 CNN under XLA (what Keras 3 compiles on a GPU by default): its chunks were 33x once (xla_chunks.md).
$PY benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered --jit_compile --steps=1 --rounds=3 --json=$out/cifar10_b256_keras3_xla.json | tee $out/cifar10_b256_keras3_xla.md
$PY benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered,tf_tempered_low_memory --steps=2 --rounds=5 --json=$out/cifar10_b256_low_memory_keras3.json | tee $out/cifar10_b256_low_memory_keras3.md
# The passes in chunks (EngineOptions.physical_batch_size, default "auto"), against the whole batch.
$PY benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 --paths=nonprivate,tf_tempered,tf_tempered_whole,tf_tempered_chunks128,tf_tempered_tf_ops --steps=2 --rounds=5 --json=$out/cifar10_b256_chunks_keras3.json | tee $out/cifar10_b256_chunks_keras3.md
$PY benchmarks/dp_step.py --keras=3 --model=mnist --batch_size=4096 --paths=nonprivate,tf_tempered,tf_tempered_whole --steps=3 --json=$out/mnist_b4096_chunks_keras3.json | tee $out/mnist_b4096_chunks_keras3.md
# Peak memory with each configuration alone in its process (in one process the allocator's peak also holds what
# earlier paths left), twice.
{
  for r in 1 2; do
    $PY benchmarks/memory_alone.py text nonprivate; $PY benchmarks/memory_alone.py text dp
    $PY benchmarks/memory_alone.py cifar10 nonprivate; $PY benchmarks/memory_alone.py cifar10 dp
    $PY benchmarks/memory_alone.py lstm nonprivate; $PY benchmarks/memory_alone.py lstm dp
    $PY benchmarks/memory_alone.py gru nonprivate; $PY benchmarks/memory_alone.py gru dp
    $PY benchmarks/memory_alone.py cifar10 dp '{"clipped_sum": "recompute", "materialize_max_bytes": 8388608, "patch_chunk_bytes": 4194304}'
  done
} 2>/dev/null | tee $out/memory_alone_keras3.txt
# The train script end to end: DP-SGD vs --nodpsgd, paired fresh processes (issue 30).
$PY benchmarks/end_to_end.py --pairs=3 --json=$out/end_to_end_mnist.json | tee $out/end_to_end_mnist.md
$PY benchmarks/end_to_end.py --pairs=3 --dp_args=--nopoisson_padding --json=$out/end_to_end_mnist_unpadded.json | tee $out/end_to_end_mnist_unpadded.md
# Where its step time goes: Poisson padding against the engine (issue 30), and the Poisson draw alone.
$PY benchmarks/train_step_times.py --rounds=3 --json=$out/train_step_times_mnist.json | tee $out/train_step_times_mnist.md
$PY benchmarks/poisson_sampler.py | tee $out/poisson_sampler.md
# Peers on the same machine in the same run, each against its own non-private step.
if [ -n "${PEERS_PYTHON:-}" ]; then
  for peer in opacus jax; do
    for model in mnist text; do
      steps=$([ "$model" = text ] && echo "--steps=2 --rounds=5" || echo "")
      { echo "Command: \`python benchmarks/peers/${peer}_step.py --model=$model $steps --json=$out/peers_${peer}_${model}_b256.json\`"; echo
        $PEERS_PYTHON benchmarks/peers/${peer}_step.py --model=$model $steps --json=$out/peers_${peer}_${model}_b256.json 2>/dev/null
      } | tee $out/peers_${peer}_${model}_b256.md
    done
  done
fi
# One table of every dp_step.py row above, with commands and per-layer paths.
$PY benchmarks/summarize.py $out/mnist_b256.json $out/mnist_b4096.json $out/cifar10_b256.json \
  $out/locally_connected_b256.json \
  $out/mnist_b256_dynamic.json $out/cifar10_b256_dynamic.json $out/mnist_b256_keras3.json \
  $out/cifar10_b256_keras3.json $out/text_b256_keras3.json $out/conv1d_b256_keras3_run_all.json \
  $out/mobilenet_b256_keras3_run_all.json $out/lstm_b256_keras3_run_all.json $out/gru_b256_keras3.json \
  $out/gru_reset_before_b256_keras3.json \
  $out/lora_b64_keras3.json \
  $out/mnist_b256_keras3_xla.json $out/cifar10_b256_keras3_xla.json $out/cifar10_b256_low_memory_keras3.json \
  $out/cifar10_b256_chunks_keras3.json $out/mnist_b4096_chunks_keras3.json > $out/summary.md
