#!/bin/bash
# Three seeds of the MNIST recipe (log8 storage): seed 0 on an empty cache (native ops compiled, features computed), 1 and 2 after it.
wt=/work/wt_log8; base=/work/scratch/log8; export TF_TEMPERED_CACHE_DIR=$base/cache
cd $wt
for seed in 0 1 2; do
  out=$base/seed$seed; mkdir -p $out
  date -u > $out/start
  PYTHONPATH=$wt /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=$seed --output_dir=$out/run --nosave_model > $out/log 2> $out/time_v.txt
  date -u > $out/end
  du -sb $base/cache/scatternet > $out/du.txt; du -sb $base/cache >> $out/du.txt
done
