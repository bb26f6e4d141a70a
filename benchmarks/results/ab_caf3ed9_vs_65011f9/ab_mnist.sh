for i in 1 2 3; do for wt in wt-old wt-runall; do
echo "== $wt round $i"
cd /work/$wt/benchmarks && PYTHONPATH=/work/$wt /work/venv311/bin/python dp_step.py --keras=3 --model=mnist --paths=nonprivate,tf_tempered --rounds=15 2>&1 | grep "^| \(non\|tf_\)"
cd /work/$wt/benchmarks && PYTHONPATH=/work/$wt /work/venv311/bin/python dp_step.py --keras=3 --model=mobilenet --paths=nonprivate,tf_tempered --rounds=5 2>&1 | grep "^| \(tf_\)"
done; done
