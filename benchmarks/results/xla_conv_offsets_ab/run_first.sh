#!/bin/bash
# Alternating fresh processes of the commit before (04396a3) and after (a5c4b63).
out=/work/scratch/ab
for i in 1 2 3; do
  for side in before after; do
    cd /work/wt-$side
    PYTHONPATH=/work/wt-$side /work/venv311/bin/python benchmarks/dp_step.py --keras=3 --batch_size=256 \
      --paths=nonprivate_xla,tf_tempered_xla --rounds=3 --json=$out/mnist_xla_${side}_$i.json > $out/mnist_xla_${side}_$i.log 2>&1
  done
done
for i in 1 2; do
  for side in before after; do
    cd /work/wt-$side
    PYTHONPATH=/work/wt-$side /work/venv311/bin/python benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 \
      --paths=nonprivate_xla,tf_tempered_xla --steps=2 --rounds=2 --json=$out/cifar_xla_${side}_$i.json > $out/cifar_xla_${side}_$i.log 2>&1
  done
done
echo done > $out/DONE
