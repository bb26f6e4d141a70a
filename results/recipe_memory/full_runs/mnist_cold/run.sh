#!/bin/bash
cd /work/wt-mem3 && date -u > /work/scratch/cold2/start
TF_TEMPERED_CACHE_DIR=/work/scratch/cold2/cache PYTHONPATH=/work/wt-mem3 /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=mnist --data_dir=/work/shared/data --seed=0 --output_dir=/work/scratch/cold2/run > /work/scratch/cold2/log 2> /work/scratch/cold2/time_v.txt
date -u > /work/scratch/cold2/end
du -sb /work/scratch/cold2/cache/scatternet > /work/scratch/cold2/du.txt; du -sb /work/scratch/cold2/cache >> /work/scratch/cold2/du.txt
