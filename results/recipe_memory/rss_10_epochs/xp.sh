#!/bin/bash
# xp.sh NAME EPOCHS [env...]: a recipe run from /work/wt-mem with RSS sampling
name=$1; ep=$2; shift 2
cd /tmp && rm -rf /tmp/rss_$name
env "$@" PYTHONPATH=/work/wt-mem /work/venv311/bin/python /work/scratch/rss/sample.py /work/scratch/rss/$name.log -- /work/venv311/bin/python -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=0 --epochs=$ep --output_dir=/tmp/rss_$name
