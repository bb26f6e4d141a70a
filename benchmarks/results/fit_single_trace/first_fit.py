"""The time of a private model's first fit (the DP step traced, then 2 steps), with Keras 3's
compiled metrics built before fit (new: one trace of the DP step) and inside the first trace
as Keras does (old: keras_bridge.build_compiled_state made a no-op, two traces), alternating in
one process, each fit on a fresh model; and the non-private model's first fit.

    TF_TEMPERED_ROOT=<checkout> python first_fit.py ROUNDS
"""
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.environ.get("TF_TEMPERED_ROOT", "."))
from tf_tempered import keras_bridge  # noqa: E402
from tf_tempered._compat import keras  # noqa: E402
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private  # noqa: E402
from tf_tempered.privacy.step import keras_step  # noqa: E402

rng = np.random.default_rng(0)
x, y = rng.random([512, 28, 28, 1], np.float32), rng.integers(0, 10, 512)
build = keras_bridge.build_compiled_state
step = keras_step.train_step
traces = []


def counted_step(model, data):
    traces.append(1)
    return step(model, data)


keras_step.train_step = counted_step


def mnist_cnn():
    return keras.Sequential([
        keras.Input([28, 28, 1]),
        keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="tanh"),
        keras.layers.MaxPool2D(2, 1), keras.layers.Conv2D(32, 4, strides=2, activation="tanh"),
        keras.layers.MaxPool2D(2, 1), keras.layers.Flatten(),
        keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(10)])


def first_fit(variant):
    model = mnist_cnn()
    if variant == "nonprivate":
        optimizer = keras.optimizers.SGD(0.1)
    else:
        make_private(model)
        optimizer = DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.1)
    model.compile(optimizer, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    keras_bridge.build_compiled_state = (lambda *_: False) if variant == "old" else build
    del traces[:]
    start = time.monotonic()
    model.fit(x, y, batch_size=256, epochs=1, verbose=0)
    return time.monotonic() - start, len(traces)


first_fit("new")  # warm-up: imports, the native library, TF's first graphs
times = {"new": [], "old": [], "nonprivate": []}
counts = {}
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for variant in times:
        seconds, counts[variant] = first_fit(variant)
        times[variant].append(seconds)
for variant, v in times.items():
    print(f"{variant:10s} first fit median {np.median(v):.3f} s (min {min(v):.3f}, max {max(v):.3f});"
          f" DP step traced {counts[variant]} time(s)")
print(f"old - new per round: median {np.median(np.subtract(times['old'], times['new'])):.3f} s")
