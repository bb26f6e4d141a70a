#!/bin/bash
# The A/B of locally_connected_ab_keras2.md, implementation=2 and 3: fresh processes alternating
# BEFORE (a worktree of 3d4b202: the generic VJP) and AFTER (a worktree of the commit that added
# --model=locally_connected_masked/_sparse), the benchmark script of AFTER for both.
#   BEFORE=... AFTER=... OUT=... PYTHON=python3.11 bash run.sh
cd $OUT
for model in locally_connected_masked locally_connected_sparse; do
  for i in 1 2; do
    for which in before after; do
      if [ $which = before ]; then root=$BEFORE; else root=$AFTER; fi
      PYTHONPATH=$root $PYTHON $AFTER/benchmarks/dp_step.py --keras=2 --model=$model \
        --paths=nonprivate,tf_tempered --rounds=5 --json=$OUT/${model}_${which}_$i.json > $OUT/${model}_${which}_$i.txt 2>&1
    done
  done
done
echo done > $OUT/DONE
