# The MNIST and CIFAR-10 CNNs, fresh processes alternating two git worktrees, Keras 3, batch 256:
#   bash benchmarks/results/noise_after_sums/ab_cnn.sh <worktree before> <worktree after> [python]
PY=${3:-python}
for rep in 1 2; do
  for label in before after; do
    if [ $label = before ]; then tree=$1; else tree=$2; fi
    cd "$tree" || exit 1
    for model in mnist cifar10; do
      r=10; [ $model = cifar10 ] && r=3
      echo "== $model dp_step $label rep$rep"
      PYTHONPATH=$tree $PY benchmarks/dp_step.py --keras=3 --model=$model --paths=nonprivate,tf_tempered \
        --rounds=$r 2>/dev/null | grep -E "^\| (nonprivate|tf_tempered) "
    done
  done
done
