#!/bin/bash
# Run from the worktree of the commit under test.
set -x
cd /work/wt
export PYTHONPATH=/work/wt
PY=/work/venv311/bin/python
R=/work/scratch/bench
date -u
$PY -u benchmarks/conv_kernel_grads.py --layers mnist_conv1,mnist_conv2 > $R/ckg_eigen.txt 2>&1
TF_ENABLE_ONEDNN_OPTS=1 $PY -u benchmarks/conv_kernel_grads.py --layers mnist_conv1,mnist_conv2 > $R/ckg_onednn.txt 2>&1
date -u
P=nonprivate,tf_tempered,tf_tempered_tf_ops,tf_tempered_tf_ops_patches,nonprivate_xla,tf_tempered_xla,tf_tempered_tf_ops_blocks_xla
$PY benchmarks/dp_step.py --keras=3 --batch_size=256 --paths=$P --json=$R/dp_eigen_k3.json > $R/dp_eigen_k3.txt 2>&1
date -u
$PY benchmarks/dp_step.py --keras=2 --batch_size=256 --paths=nonprivate,tf_tempered,tf_tempered_tf_ops,tf_tempered_tf_ops_patches --json=$R/dp_eigen_k2.json > $R/dp_eigen_k2.txt 2>&1
date -u
TF_ENABLE_ONEDNN_OPTS=1 $PY benchmarks/dp_step.py --keras=3 --batch_size=256 --paths=nonprivate,tf_tempered,tf_tempered_tf_ops,tf_tempered_tf_ops_blocks --json=$R/dp_onednn_k3.json > $R/dp_onednn_k3.txt 2>&1
date -u
echo ALLDONE
