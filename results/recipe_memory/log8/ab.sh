#!/bin/bash
# Side by side, alternating: the MNIST recipe for 10 epochs with the shifted copies in float16 (before) and in log8 codes (now), caches filled.
wt=/work/wt_log8; base=/work/scratch/log8/ab; mkdir -p $base
cp /work/scratch/log8/cache/native_ops-*.so /work/scratch/f16cache/ 2>/dev/null
cd $wt
for round in 1 2; do
  for storage in float16 log8; do
    if [ $storage = float16 ]; then cache=/work/scratch/f16cache; else cache=/work/scratch/log8/cache; fi
    out=$base/${storage}_r$round; mkdir -p $out
    TF_TEMPERED_CACHE_DIR=$cache PYTHONPATH=$wt /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=0 --epochs=10 --feature_storage=$storage --output_dir=$out/run --nosave_model > $out/log 2> $out/time_v.txt
  done
done
