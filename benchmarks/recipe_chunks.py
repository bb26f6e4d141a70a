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
"""The MNIST --recipe=best DP step (ScatterNet CNN head on [7, 7, 81] features, augmentation
multiplicity 4, SGD with momentum, a padded Poisson batch) with EngineOptions.physical_batch_size
"auto" (the default: 2 chunks here) against the whole batch, side by side in one process, on
random features of the real shape (no ScatterNet cache needed).

    python benchmarks/recipe_chunks.py [EXAMPLES] [ROUNDS]     # default 1100 padded examples, 5
"""

import os
import sys

if __name__ == "__main__":  # TF keeps CPU allocator statistics only with the BFC allocator
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")

# pylint: disable=wrong-import-position
import statistics
import time

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private
from tf_tempered.privacy.step import chunk_sizes
from tf_tempered.scatternet import scatternet_cnn

MULTIPLICITY = 4


def main(examples=1100, rounds=5):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(examples * MULTIPLICITY, 7, 7, 81)).astype(np.float32)
    y = np.repeat(rng.integers(0, 10, examples), MULTIPLICITY)
    mask = np.ones(examples * MULTIPLICITY, np.float32)
    mask[-MULTIPLICITY * (examples // 12):] = 0.0  # the Poisson padding at the end
    weights = {"mask": mask, "expected_batch_size": np.float32(examples * 0.92)}
    data = tf.data.Dataset.from_tensors((x, y, weights)).repeat()
    models = {}
    for name, physical in (("auto", "auto"), ("whole", None)):
        model = scatternet_cnn("tanh", input_shape=(7, 7, 81), num_classes=10, groups=None)
        make_private(model, options=EngineOptions(physical_batch_size=physical),
                     augmentation_multiplicity=MULTIPLICITY)
        model.compile(DPKerasSGDOptimizer(l2_norm_clip=0.1, noise_multiplier=1.0,
                                          learning_rate=1.0, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                      reduction="none"))
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # trace and warm up
        models[name] = model
    size = chunk_sizes.auto_physical_batch_size(models["auto"], examples, MULTIPLICITY)
    print(f"{examples} examples x {MULTIPLICITY} copies; auto: chunks of "
          f"{chunk_sizes.auto_chunk_examples(examples, size) if size else examples} examples")
    times = {name: [] for name in models}
    peaks = {name: 0 for name in models}
    for _ in range(rounds):
        for name, model in models.items():
            tf.config.experimental.reset_memory_stats("CPU:0")
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=3, epochs=1, verbose=0)
            times[name].append((time.perf_counter() - start) / 3 * 1000)
            peaks[name] = max(peaks[name], tf.config.experimental.get_memory_info("CPU:0")["peak"])
    for name in models:
        print(f"{name}: {statistics.median(times[name]):.0f} ms/step (rounds "
              f"{', '.join(f'{t:.0f}' for t in times[name])}), peak {peaks[name] / 2**20:.0f} MiB")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
