"""Peak memory of one MNIST step variant (TF's BFC allocator peak over 10 steps), one per process.

    TF_TEMPERED_ROOT=<checkout> python mem_variant.py nonprivate|default|matconv2

default: the default DP step (ab_inproc2.py's "biasonly"); matconv2: conv2's per-example
gradients kept (native_materialize_min_rows=16).
"""
import os
import sys

os.environ["TF_CPU_ALLOCATOR_USE_BFC"] = "true"  # before TensorFlow: its CPU peak needs BFC
ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
from tf_tempered._compat import tf, keras  # noqa: E402
from tf_tempered.privacy import make_private, DPKerasSGDOptimizer, EngineOptions  # noqa: E402

data = next(iter(dp_step._dataset("mnist", 256)))
name = sys.argv[1]
if name == "nonprivate":
    m = dp_step._compiled("nonprivate", "mnist", 256)
else:
    m = dp_step._model("mnist")
    make_private(m, options=EngineOptions(native_materialize_min_rows=16) if name == "matconv2" else None)
    m.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.15),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
step = tf.function(m.train_step)
for _ in range(3):
    step(data)
tf.config.experimental.reset_memory_stats("CPU:0")
for _ in range(10):
    step(data)
print(name, "peak MiB", tf.config.experimental.get_memory_info("CPU:0")["peak"] / 2**20)
