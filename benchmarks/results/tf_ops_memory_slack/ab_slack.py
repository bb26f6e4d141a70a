"""In-process A/B of the TF-ops step with rows_path.MAX_MEMORY_SLACK at its default (2) and
at 1 (the rule before: kept gradients no larger than what the ghost norm keeps), interleaved.

    TF_TEMPERED_ROOT=<checkout> python ab_slack.py ROUNDS nonprivate,slack2,slack1[,slack2_,...]

MODEL=cifar10 (default) or any dp_step.py model; PATH_=tf_tempered_tf_ops (default) or
tf_tempered; CALLS=2 calls per round. A trailing "_" repeats a variant. Prints each
variant's layer paths, its peak memory over one call, and the interleaved timings.
"""
import os
import sys

ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
import interleaved  # noqa: E402
from tf_tempered._compat import tf  # noqa: E402
from tf_tempered.privacy.layer_grads import rows_path  # noqa: E402
from tf_tempered.privacy.layer_report import layer_paths  # noqa: E402

MODEL = os.environ.get("MODEL", "cifar10")
DP_PATH = os.environ.get("PATH_", "tf_tempered_tf_ops")
BATCH = 64 if MODEL in ("lora", "conv_lstm") else 256

data = next(iter(dp_step._dataset(MODEL, BATCH)))
default_slack = rows_path.MAX_MEMORY_SLACK
steps = {}
for name in sys.argv[2].split(","):
    base = name.rstrip("_")
    if base == "nonprivate":
        model = dp_step._compiled("nonprivate", MODEL, BATCH)
    else:  # the path is chosen while tracing: trace under this variant's slack
        rows_path.MAX_MEMORY_SLACK = float(base.removeprefix("slack"))
        model = dp_step._compiled(DP_PATH, MODEL, BATCH)
    steps[name] = tf.function(model.train_step)
    for _ in range(2):
        steps[name](data)
    rows_path.MAX_MEMORY_SLACK = default_slack
    if base != "nonprivate":
        print(name, "; ".join(f"{p['layer']}: {p['path']}" for p in layer_paths(model)))
for name, step in steps.items():
    tf.config.experimental.reset_memory_stats("CPU:0")
    step(data)
    print(f"{name} peak {tf.config.experimental.get_memory_info('CPU:0')['peak'] / 2**20:.0f} MiB")
interleaved.report(interleaved.time_rounds(steps, data, int(sys.argv[1]),
                                           calls=int(os.environ.get("CALLS", "2"))))
