#!/bin/bash
out=/work/scratch/ab2
for i in 1 2 3; do
  for side in before after; do
    cd /work/wt-$side
    PYTHONPATH=/work/wt-$side /work/venv311/bin/python benchmarks/dp_step.py --keras=3 --batch_size=256 \
      --paths=nonprivate_xla,tf_tempered_xla --rounds=5 --json=$out/mnist_xla_${side}_$i.json > $out/mnist_xla_${side}_$i.log 2>&1
  done
done
echo done > $out/DONE
