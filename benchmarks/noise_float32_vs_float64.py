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
"""Box–Muller noise from float32 against float64 Philox uniforms (3.4 M values, one process).

The sampler before commit e03d84e drew float32 uniforms (tails end at 5.65σ); privacy/randomness.py
now draws float64 ones (8.49σ). "mixed": float64 u₁ with the logarithm in float32. "library": the
sampler privacy/randomness.py uses since 2e0d114 (float64 u₁ for the radius, the angle's u₂ its own
float32 draw) against "new" (both in float64, e03d84e to ed7a366). Interleaved rounds, median ms
(benchmarks/results/refactor_ab_keras3.md, benchmarks/results/time_distributed_and_noise_ab_keras3.md).

    python benchmarks/noise_float32_vs_float64.py
"""
import time, numpy as np
from tf_tempered._compat import tf
n = 3_200_000 + 200_000
key = tf.constant([12345], tf.uint64); counter = tf.constant([0, 7], tf.uint64)
def interleaved(**samplers):
    """Median ms of each sampler over 15 interleaved rounds (each traced once before)."""
    for f in samplers.values(): f()
    res = {name: [] for name in samplers}
    for _ in range(15):
        for name, f in samplers.items():
            t = time.perf_counter(); f().numpy(); res[name].append((time.perf_counter() - t) * 1000)
    print({k: f"{np.median(v):.1f} ms" for k, v in res.items()})
@tf.function
def old():
    u = tf.raw_ops.StatelessRandomUniformV2(shape=tf.constant([2, n // 2], tf.int64), key=key, counter=counter, alg=1, dtype=tf.float32)
    r = tf.sqrt(-2.0 * tf.math.log(1.0 - u[0])); a = (2.0 * np.pi) * u[1]
    return tf.concat([r * tf.cos(a), r * tf.sin(a)], 0)
@tf.function
def new():
    u = tf.raw_ops.StatelessRandomUniformV2(shape=tf.constant([2, n // 2], tf.int64), key=key, counter=counter, alg=1, dtype=tf.float64)
    r = tf.cast(tf.sqrt(-2.0 * tf.math.log1p(-u[0])), tf.float32); a = tf.cast((2.0 * np.pi) * u[1], tf.float32)
    return tf.concat([r * tf.cos(a), r * tf.sin(a)], 0)
interleaved(old=old, new=new)
@tf.function
def mixed():
    u = tf.raw_ops.StatelessRandomUniformV2(shape=tf.constant([2, n // 2], tf.int64), key=key, counter=counter, alg=1, dtype=tf.float64)
    r = tf.sqrt(-2.0 * tf.math.log(tf.cast(1.0 - u[0], tf.float32))); a = (2.0 * np.pi) * tf.cast(u[1], tf.float32)
    return tf.concat([r * tf.cos(a), r * tf.sin(a)], 0)
interleaved(new=new, mixed=mixed)
x = mixed().numpy(); print(x.std(), np.abs(x).max())
from tf_tempered.privacy import randomness
source = randomness.DPRandomness("noise")
library = tf.function(lambda: source.normal([n], stddev=1.0, counter=tf.constant(7, tf.int64)))
interleaved(new=new, library=library)
