#!/bin/bash
# The MNIST recipe's first run on an empty cache (native ops compiled, features computed), nothing else running.
wt=/work/wt_log8; out=/work/scratch/log8/cold; rm -rf $out; mkdir -p $out/cache
cd $wt && date -u > $out/start
TF_TEMPERED_CACHE_DIR=$out/cache PYTHONPATH=$wt /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=0 --output_dir=$out/run --nosave_model > $out/log 2> $out/time_v.txt
date -u > $out/end
du -sb $out/cache/scatternet > $out/du.txt; du -sb $out/cache >> $out/du.txt
