# Copyright 2026 The tf_tempered Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#      http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""What the graph-reading checks of an eager DP step cost (run_eagerly=True, a DPGradients
called outside tf.function), traced on every step (as the engine does) against once per
model (as it did before: a layer's Python changed after the first step went unchecked).

    python benchmarks/eager_checks.py                             # Keras 3
    TF_USE_LEGACY_KERAS=1 python benchmarks/eager_checks.py       # tf-keras

Two models (a 2-layer MLP on 20 features; the paper's MNIST CNN), batch 64, 20 eager fit
steps, each variant twice, interleaved in one process; prints the best time of each and
their ratio.
"""

import time
import warnings

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.privacy import make_private
from tf_tempered.privacy.step import graph_checks

STEPS, BATCH = 20, 64


def _model(kind):
    if kind == "mlp":
        return keras.Sequential([keras.Input((20,)), keras.layers.Dense(64, activation="tanh"),
                                 keras.layers.Dense(10)])
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="tanh"),
        keras.layers.MaxPool2D(2, 1), keras.layers.Conv2D(32, 4, strides=2, activation="tanh"),
        keras.layers.MaxPool2D(2, 1), keras.layers.Flatten(),
        keras.layers.Dense(32, activation="tanh"), keras.layers.Dense(10)])


def _fit_time(kind, every_step):
    check = graph_checks.check_in_a_graph
    done = []

    def first_only(*args):
        if not done:
            done.append(True)
            check(*args)

    graph_checks.check_in_a_graph = check if every_step else first_only
    try:
        model = make_private(_model(kind), l2_norm_clip=1.0, noise_multiplier=1.0,
                             sampling="shuffle")
        model.compile(optimizer=keras.optimizers.SGD(0.1), run_eagerly=True,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        shape = (20,) if kind == "mlp" else (28, 28, 1)
        rng = np.random.default_rng(0)
        x = rng.random((BATCH * STEPS, *shape), np.float32)
        y = rng.integers(0, 10, BATCH * STEPS)
        model.fit(x[:2 * BATCH], y[:2 * BATCH], batch_size=BATCH, verbose=0)  # warm-up
        start = time.perf_counter()
        model.fit(x, y, batch_size=BATCH, verbose=0)
        return time.perf_counter() - start
    finally:
        graph_checks.check_in_a_graph = check


def main():
    warnings.simplefilter("ignore")
    print("| model | eager step, checked every step (ms) | checked once (ms) | ratio |")
    print("|---|---|---|---|")
    for kind in ("mlp", "cnn"):
        times = {True: [], False: []}
        for _ in range(2):
            for every_step in (True, False):
                times[every_step].append(_fit_time(kind, every_step))
        every, once = min(times[True]) / STEPS * 1e3, min(times[False]) / STEPS * 1e3
        print(f"| {kind} | {every:.0f} | {once:.0f} | {every / once:.2f}× |")


if __name__ == "__main__":
    main()
