"""In-process A/B of MNIST DP step variants (tf.function(train_step), interleaved rounds).

    TF_TEMPERED_ROOT=<checkout> python ab_inproc2.py ROUNDS nonprivate,biasonly,matconv2,old

biasonly: the default step; matconv2: conv2's per-example gradients kept
(native_materialize_min_rows=16); old: the per-example bias gradients of the native
Conv2D path by a reduce_sum over g (the handler's code before the bias sums joined the
native op), patched in while its step is traced. The "new" variant of the results file
(per-example weights inside the native op) was measured on code since removed.
"""
import dataclasses
import os
import sys
import time

import numpy as np

ROOT = os.environ.get("TF_TEMPERED_ROOT", ".")
sys.path.insert(0, ROOT + "/benchmarks")
sys.path.insert(0, ROOT)
import dp_step  # noqa: E402
from tf_tempered._compat import tf, keras  # noqa: E402
from tf_tempered.privacy import make_private, DPKerasSGDOptimizer, EngineOptions  # noqa: E402
from tf_tempered.privacy.layer_grads import conv  # noqa: E402

data = next(iter(dp_step._dataset("mnist", 256)))
native_kernel = conv._native_kernel


def old_native_kernel(src, hparams, path, m):  # no bias sums: linear_norms' reduce_sum
    return native_kernel(src, dataclasses.replace(hparams, use_bias=False), path, m)[0], None


def dp_model(options=None):
    model = dp_step._model("mnist")
    make_private(model, options=options)
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.15),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    return model


variants = sys.argv[2].split(",")
steps = {}
for name in variants:
    if name == "nonprivate":
        model = dp_step._compiled("nonprivate", "mnist", 256)
    elif name.startswith("matconv2"):
        model = dp_model(EngineOptions(native_materialize_min_rows=16))
    else:
        model = dp_model()
    if name.startswith("old"):
        conv._native_kernel = old_native_kernel
    steps[name] = tf.function(model.train_step)
    for _ in range(5):
        steps[name](data)
    conv._native_kernel = native_kernel
times = {n: [] for n in steps}
for _ in range(int(sys.argv[1])):
    for n, f in steps.items():
        t = time.perf_counter()
        for _ in range(10):
            f(data)
        times[n].append((time.perf_counter() - t) / 10 * 1000)
base = np.median(times[variants[0]])
for n, v in times.items():
    print(f"{n:12s} median {np.median(v):.2f} ms  x{np.median(v) / base:.3f} of {variants[0]} "
          f"(q25 {np.percentile(v, 25):.2f} q75 {np.percentile(v, 75):.2f})")
for a in variants[1:]:
    for b in variants[1:]:
        if a < b:
            ratio = np.median(np.array(times[b]) / np.array(times[a]))
            print(f"{b}/{a} per-round median {ratio:.3f}")
