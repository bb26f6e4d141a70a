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
"""Box–Muller noise samplers side by side (3.4 M values, one process, interleaved rounds, median ms).

- "float32": the sampler before commit e03d84e, float32 uniforms (tails end at √(46 ln 2) ≈ 5.65σ,
  a truncation that adds to δ: docs/randomness.md, "Truncated tails").
- "float64_radius": 2e0d114 to 5d4a4fa, float64 u₁ and a float64 logarithm for the radius (8.49σ),
  the angle its own float32 draw.
- "library": privacy/randomness.py now, u₁ = (k + ½)·2⁻⁶⁴ from 64 random bits in float32
  (9.49σ), the same angle.

(benchmarks/results/refactor_ab_keras3.md, benchmarks/results/time_distributed_and_noise_ab_keras3.md,
benchmarks/results/noise_u64_ab_keras3.md.)

    python benchmarks/noise_float32_vs_float64.py
"""
import time

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import randomness

NUM_VALUES = 3_200_000 + 200_000
PAIRS = tf.constant([NUM_VALUES // 2], tf.int64)
KEY = tf.constant([12345], tf.uint64)
RADIUS_COUNTER = tf.constant([0, 7], tf.uint64)
ANGLE_COUNTER = tf.constant([1 << 47, 7], tf.uint64)


def interleaved(rounds=15, **samplers):
    """Median ms of each sampler over interleaved rounds (each traced once before)."""
    for sampler in samplers.values():
        sampler()
    times = {name: [] for name in samplers}
    for _ in range(rounds):
        for name, sampler in samplers.items():
            start = time.perf_counter()
            sampler().numpy()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: float(np.median(values)) for name, values in times.items()}


def _uniform(counter, dtype):
    return tf.raw_ops.StatelessRandomUniformV2(shape=PAIRS, key=KEY, counter=counter, alg=1,
                                               dtype=dtype)


def _pairs(radius):
    angle = (2.0 * np.pi) * _uniform(ANGLE_COUNTER, tf.float32)
    return tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], 0)


@tf.function
def float32():
    return _pairs(tf.sqrt(-2.0 * tf.math.log1p(-_uniform(RADIUS_COUNTER, tf.float32))))


@tf.function
def float64_radius():
    radius_squared = -2.0 * tf.math.log1p(-_uniform(RADIUS_COUNTER, tf.float64))
    return _pairs(tf.sqrt(tf.cast(radius_squared, tf.float32)))


def main():
    source = randomness.DPRandomness("noise")
    library = tf.function(lambda: source.normal([NUM_VALUES], stddev=1.0,
                                                counter=tf.constant(7, tf.int64)))
    for run in (1, 2):
        medians = interleaved(float32=float32, float64_radius=float64_radius, library=library)
        print(f"run {run}: " + ", ".join(f"{k} {v:.1f} ms" for k, v in medians.items()))
    draw = library().numpy()
    print(f"library draw: std {draw.std():.4f}, max |z| {np.abs(draw).max():.2f}")


if __name__ == "__main__":
    main()
