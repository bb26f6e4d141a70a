"""XLA's CPU scheduler and the DP step's memory: paired processes with XLA's default scheduler
and with ``--xla_cpu_enable_concurrency_optimized_scheduler=false``.

    TF_TEMPERED_ROOT=<checkout> python xla_scheduler.py [ROUNDS] [MODELS]

XLA_FLAGS is read once per process, so each round runs one process per setting, in
alternating order. Each process (``--child``) compiles dp_step.py's non-private and DP
steps of each model with jit_compile=True, times CALLS calls of each after the first
(tracing and compilation, also timed) and reports the peak of TF's CPU allocator over
them. Prints a Markdown table of medians over the rounds.
"""
import json
import os
import statistics
import subprocess
import sys
import time

FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler=false"
CALLS = 5


def child(models):
    root = os.environ.get("TF_TEMPERED_ROOT", ".")
    sys.path.insert(0, root + "/benchmarks")
    sys.path.insert(0, root)
    import dp_step  # pylint: disable=import-outside-toplevel
    from tf_tempered._compat import tf  # pylint: disable=import-outside-toplevel
    results = {}
    for model_name in models:
        data = next(iter(dp_step._dataset(model_name, 256)))  # pylint: disable=protected-access
        for path in ("nonprivate_xla", "tf_tempered_xla"):
            model = dp_step._compiled(path, model_name, 256)  # pylint: disable=protected-access
            step = tf.function(model.train_step, jit_compile=True)
            start = time.perf_counter()
            step(data)
            first = time.perf_counter() - start
            tf.config.experimental.reset_memory_stats("CPU:0")
            times = []
            for _ in range(CALLS):
                start = time.perf_counter()
                step(data)
                times.append(time.perf_counter() - start)
            results[f"{model_name} {path}"] = {
                "first_s": first, "step_ms": 1000 * statistics.median(times),
                "peak_mib": tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20}
    print("RESULT " + json.dumps(results), flush=True)


def main(rounds, models):
    runs = {"default": [], "flag": []}
    for r in range(rounds):
        order = ("default", "flag") if r % 2 == 0 else ("flag", "default")
        for setting in order:
            env = dict(os.environ)
            env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + (" " + FLAG if setting == "flag"
                                                            else "")).strip()
            out = subprocess.run([sys.executable, __file__, "--child", ",".join(models)],
                                 env=env, capture_output=True, text=True, timeout=1200,
                                 check=True).stdout
            runs[setting].append(json.loads(out.split("RESULT ", 1)[1]))
    print("| model | step | scheduler | step ms (median of rounds) | peak MiB | first call s |")
    print("|---|---|---|---:|---:|---:|")
    for key in runs["default"][0]:
        for setting, label in (("default", "XLA's default"), ("flag", "flag off")):
            values = [run[key] for run in runs[setting]]
            model_name, path = key.split()
            print(f"| {model_name} | {path} | {label} | "
                  f"{statistics.median(v['step_ms'] for v in values):.1f} | "
                  f"{statistics.median(v['peak_mib'] for v in values):.0f} | "
                  f"{statistics.median(v['first_s'] for v in values):.1f} |")
    per_round = {}
    for key in runs["default"][0]:
        if "tf_tempered" in key:
            model_name = key.split()[0]
            for setting in runs:
                per_round.setdefault((model_name, setting), [
                    run[key]["step_ms"] / run[f"{model_name} nonprivate_xla"]["step_ms"]
                    for run in runs[setting]])
    print()
    for (model_name, setting), ratios in per_round.items():
        print(f"{model_name}, {setting}: DP / non-private per process "
              f"{', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2].split(","))
    else:
        main(int(sys.argv[1]) if len(sys.argv) > 1 else 3,
             (sys.argv[2] if len(sys.argv) > 2 else "mnist,cifar10").split(","))
