"""Peak CPU-allocator memory and step time of ONE configuration, alone in its process.

    python benchmarks/memory_alone.py cifar10 nonprivate
    python benchmarks/memory_alone.py cifar10 dp '{"clipped_sum": "second_pass"}'

The third argument is EngineOptions as JSON. 2 warm-up steps, then the peak over 4 steps
(tf.config.experimental.get_memory_info after reset_memory_stats).
"""
import json
import os
import pathlib
import sys
import time

# TF keeps CPU allocator statistics only with the BFC allocator on CPU (set before
# TensorFlow is imported).
os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import dp_step  # noqa
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private
kind, which = sys.argv[1], sys.argv[2]
opts = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
model = dp_step._model(kind)
if which == "nonprivate":
    model.compile(keras.optimizers.SGD(0.15), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
else:
    make_private(model, options=EngineOptions(**opts))
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.15), loss=per_example)
ds = dp_step._dataset(kind, 256)
it = iter(ds.repeat())
for _ in range(2):
    model.train_on_batch(*next(it))
before = tf.config.experimental.get_memory_info("CPU:0")["current"]
tf.config.experimental.reset_memory_stats("CPU:0")
t = time.perf_counter()
for _ in range(4):
    model.train_on_batch(*next(it))
dt = (time.perf_counter() - t) / 4
peak = tf.config.experimental.get_memory_info("CPU:0")["peak"]
print(f"RESULT {which} {opts} peak {peak/2**20:.0f} MiB (in use at reset {before/2**20:.0f}) {dt*1000:.0f} ms/step")
