#!/bin/bash
# The A/B of locally_connected_ab_keras2.md: fresh processes alternating the commit before the
# LocallyConnected handler (BEFORE, a `git worktree` of 3d4b202: the generic per-example VJP)
# and the handler's commit (AFTER, a worktree of 3991de1), the benchmark script of AFTER for both.
#   BEFORE=/path/to/worktree AFTER=/path/to/worktree PYTHON=python3.11 bash run.sh OUT_DIR
set -euo pipefail
out=${1:?output folder}
mkdir -p "$out"
for i in 1 2 3; do
  for which in before after; do
    if [ "$which" = before ]; then root=$BEFORE; else root=$AFTER; fi
    PYTHONPATH=$root $PYTHON "$AFTER/benchmarks/dp_step.py" --keras=2 --model=locally_connected \
      --paths=nonprivate,tf_tempered,tf_tempered_tf_ops --jit_compile --rounds=5 \
      --json="$out/${which}_$i.json" > "$out/${which}_$i.txt" 2>&1
  done
done
