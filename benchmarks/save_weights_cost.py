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
"""What a private model's ``save_weights`` costs for carrying its DP settings and ledger.

    python benchmarks/save_weights_cost.py --rounds=20            # Keras 3
    TF_USE_LEGACY_KERAS=1 python benchmarks/save_weights_cost.py  # tf-keras (HDF5)

One private model (a Conv2D on 32×32×3, then Dense 256 and 10: 7.4 M weights), trained one
epoch; each round saves its weights twice to the same file, alternating: through Keras'
``saving_api.save_weights`` as tf_tempered wraps it (the DP dict written into the file,
:mod:`tf_tempered.privacy.weight_files`), and through the function it wraps (weights only).
Prints the median of each and their ratio.
"""

import argparse
import importlib
import os
import statistics
import tempfile
import time

import numpy as np

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.privacy import make_private


def _model():
    model = make_private(keras.Sequential([
        keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3), keras.layers.Flatten(),
        keras.layers.Dense(256), keras.layers.Dense(10)]), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    rng = np.random.default_rng(0)
    model.fit(rng.random((64, 32, 32, 3), np.float32), rng.integers(0, 10, 64), batch_size=32,
              epochs=1, verbose=0)
    return model


def measure(rounds):
    """(median ms with the DP dict, median ms weights only, their ratio)."""
    api = importlib.import_module("keras.src.saving.saving_api" if KERAS_MAJOR == 3
                                  else "tf_keras.src.saving.saving_api")
    model = _model()
    path = os.path.join(tempfile.mkdtemp(), "w.weights.h5" if KERAS_MAJOR == 3 else "w.h5")
    with_dp, weights_only = [], []
    for _ in range(rounds):
        start = time.perf_counter()
        api.save_weights(model, path)
        with_dp.append(time.perf_counter() - start)
        start = time.perf_counter()
        api.save_weights.__wrapped__(model, path)
        weights_only.append(time.perf_counter() - start)
    a, b = 1e3 * statistics.median(with_dp), 1e3 * statistics.median(weights_only)
    return a, b, a / b


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    with_dp, weights_only, ratio = measure(args.rounds)
    print(f"Keras {KERAS_MAJOR}: save_weights {with_dp:.1f} ms with the DP dict, "
          f"{weights_only:.1f} ms weights only ({ratio:.2f}×, medians of {args.rounds})")


if __name__ == "__main__":
    main()
