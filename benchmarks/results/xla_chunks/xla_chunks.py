"""The CIFAR-10 CNN's DP step under XLA: whole batch against chunks of 64 (what
physical_batch_size="auto" ran under XLA before), and the non-private step.

    TF_TEMPERED_ROOT=<checkout> python xla_chunks.py [CALLS]

Each variant: the model compiled with jit_compile=True, its train_step traced by
tf.function(jit_compile=True) (what Keras runs), the first call (tracing and XLA
compilation) timed, then CALLS calls (default 3); the minimum and median, the peak of
TF's CPU allocator over them, and the path each layer took.
"""
import os
import statistics
import sys
import time

ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
from tf_tempered._compat import keras, tf  # noqa: E402
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private  # noqa: E402
from tf_tempered.privacy.layer_report import layer_paths  # noqa: E402

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 3
VARIANTS = {"nonprivate": None, "auto (default)": EngineOptions(),
            "chunks of 64": EngineOptions(physical_batch_size=64),
            "whole": EngineOptions(physical_batch_size=None)}

data = next(iter(dp_step._dataset("cifar10", 256)))  # pylint: disable=protected-access
loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
print("| variant | first call s | step s (min) | step s (median) | peak MiB |\n|---|---:|---:|---:|---:|")
paths = {}
for name, options in VARIANTS.items():
    model = dp_step._model("cifar10")  # pylint: disable=protected-access
    if options is None:
        model.compile(keras.optimizers.SGD(0.15), loss=loss, jit_compile=True)
    else:
        make_private(model, options=options)
        model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                          learning_rate=0.15), loss=loss, jit_compile=True)
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
    peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20
    print(f"| {name} | {first:.1f} | {min(times):.3f} | {statistics.median(times):.3f} | {peak:.0f} |",
          flush=True)
    if options is not None:
        paths[name] = "; ".join(f"{p['layer']}: {p['path']}" for p in layer_paths(model))
for name, text in paths.items():
    print(f"\n{name}: {text}")
