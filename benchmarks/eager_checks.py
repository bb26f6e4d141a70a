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
"""What an eager DP step (run_eagerly=True, a DPGradients called outside tf.function) costs
now that its passes run as a function traced each step (so the graph-reading checks read what
trains), against the same passes run eagerly and unchecked (as before any check: a tied
weight's gradient went missing, a batch-mixing layer trained) and against a traced fit
(run_eagerly=False: traced once).

    python benchmarks/eager_checks.py                             # Keras 3
    TF_USE_LEGACY_KERAS=1 python benchmarks/eager_checks.py       # tf-keras

Two models (a 2-layer MLP on 20 features; the paper's MNIST CNN), batch 64, 20 fit steps,
each variant twice, interleaved in one process; prints the best time of each and the ratios.
"""

import time
import warnings

import numpy as np

from tf_tempered import keras_bridge
from tf_tempered._compat import keras
from tf_tempered.privacy import make_private
from tf_tempered.privacy.step import eager_passes
from tf_tempered.privacy.step.batch import unpack_batch
from tf_tempered.privacy.step.chunks import clipped_passes
from tf_tempered.privacy.step.plan import plan_step

STEPS, BATCH = 20, 64
VARIANTS = ("traced_each_step", "eager_unchecked", "traced_once")


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


def _eager_unchecked(model, state, data, losses):
    """Stages 3-7 run eagerly, no trace: what an eager step did before its checks."""
    plan = plan_step(model, state, check_optimizer=losses is None)
    batch = unpack_batch(data, xla=plan.xla,
                         input_shapes=keras_bridge.declared_input_shapes(model))
    return clipped_passes(model, state, plan, batch, losses=losses)


def _fit_time(kind, variant):
    engine = eager_passes.traced_passes
    if variant == "eager_unchecked":
        eager_passes.traced_passes = _eager_unchecked
    try:
        model = make_private(_model(kind), l2_norm_clip=1.0, noise_multiplier=1.0,
                             sampling="shuffle")
        model.compile(optimizer=keras.optimizers.SGD(0.1), run_eagerly=variant != "traced_once",
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
        eager_passes.traced_passes = engine


def main():
    warnings.simplefilter("ignore")
    print("| model | eager, traced each step (ms) | eager, unchecked (ms) | traced once (ms) "
          "| each step / unchecked | each step / once |")
    print("|---|---|---|---|---|---|")
    for kind in ("mlp", "cnn"):
        times = {variant: [] for variant in VARIANTS}
        for _ in range(2):
            for variant in VARIANTS:
                times[variant].append(_fit_time(kind, variant))
        each, eager, once = (min(times[v]) / STEPS * 1e3 for v in VARIANTS)
        print(f"| {kind} | {each:.0f} | {eager:.0f} | {once:.0f} | {each / eager:.2f}× "
              f"| {each / once:.2f}× |")


if __name__ == "__main__":
    main()
