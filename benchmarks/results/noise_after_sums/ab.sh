# Fresh processes alternating two git worktrees, Keras 3, batch 256:
#   bash benchmarks/results/noise_after_sums/ab.sh <worktree before> <worktree after> [python]
# Each rep: per worktree the text classifier's interleaved step (time, in-process peak), then
# each model's DP step alone in a process (memory_alone.py); then the non-private steps alone.
PY=${3:-python}
for rep in 1 2 3; do
  for label in before after; do
    if [ $label = before ]; then tree=$1; else tree=$2; fi
    cd "$tree" || exit 1
    echo "== text dp_step $label rep$rep"
    PYTHONPATH=$tree $PY benchmarks/dp_step.py --keras=3 --model=text --paths=nonprivate,tf_tempered \
      --rounds=5 2>/dev/null | grep -E "^\| (nonprivate|tf_tempered) "
    for model in text lstm gru; do
      PYTHONPATH=$tree $PY benchmarks/memory_alone.py $model dp 2>/dev/null | sed "s/^/$model $label rep$rep /"
    done
  done
  cd "$1" || exit 1
  for model in text lstm gru; do
    PYTHONPATH=$1 $PY benchmarks/memory_alone.py $model nonprivate 2>/dev/null | sed "s/^/$model nonprivate rep$rep /"
  done
done
