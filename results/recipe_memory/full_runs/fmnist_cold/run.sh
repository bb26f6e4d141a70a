#!/bin/bash
cd /work/wt-head && date -u > /work/scratch/coldf/start
TF_TEMPERED_CACHE_DIR=/work/scratch/coldf/cache PYTHONPATH=/work/wt-head /usr/bin/time -v /work/venv311/bin/python -u -m tf_tempered.experiments.train --recipe=best --dataset=fashion_mnist --data_dir=/work/shared/data --seed=0 --output_dir=/work/scratch/coldf/run > /work/scratch/coldf/log 2> /work/scratch/coldf/time_v.txt
date -u > /work/scratch/coldf/end
du -sb /work/scratch/coldf/cache/scatternet > /work/scratch/coldf/du.txt; du -sb /work/scratch/coldf/cache >> /work/scratch/coldf/du.txt
