#!/bin/bash
# full.sh NAME WORKTREE [extra flags]: one full MNIST recipe run, /usr/bin/time -v, from the worktree
name=$1; wt=$2; shift 2
out=/work/scratch/rss/$name; rm -rf $out; mkdir -p $out
cd $wt && date -u > $out/start
PYTHONPATH=$wt /usr/bin/time -v /work/venv311/bin/python -m tf_tempered.experiments.train --recipe=best --data_dir=/work/shared/data --seed=0 --output_dir=$out/run "$@" > $out/log 2> $out/time_v.txt
date -u > $out/end
