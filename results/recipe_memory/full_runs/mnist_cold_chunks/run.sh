#!/bin/bash
cd /work/wt-recipe && date -u > /work/scratch/cold3/start
TF_TEMPERED_CACHE_DIR=/work/scratch/cold3/cache PYTHONPATH=/work/wt-recipe /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=0 --output_dir=/work/scratch/cold3/run > /work/scratch/cold3/log 2> /work/scratch/cold3/time_v.txt
date -u > /work/scratch/cold3/end
du -sb /work/scratch/cold3/cache/scatternet > /work/scratch/cold3/du.txt; du -sb /work/scratch/cold3/cache >> /work/scratch/cold3/du.txt
