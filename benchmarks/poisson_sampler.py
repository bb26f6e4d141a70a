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
"""CPU time of drawing one Poisson batch: geometric gaps against one uniform per example.

``poisson_batches`` draws a step's members from max_batch_size + 1 uniforms (the gaps
between members are geometric: ``poisson_draws.bernoulli_members``); the sampler before it
drew one uniform per example and kept those below q. Both run here in the same
tf.data pipeline (draw, gather, pad), side by side in one process, on N examples of
4 features (the gather is then cheap: what is left is the draw), for every N given.
The process's CPU time (user + system) per batch counts the pipeline's parallel
threads too, which a training step shares its cores with.

    python benchmarks/poisson_sampler.py
    python benchmarks/poisson_sampler.py --num_examples=60000,1000000 --rounds=3
"""

import argparse
import resource
import statistics

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import sampling


def per_example_drawer(data, q, max_batch_size):
    """The previous draw: one float64 uniform per example, members where u < q, padded."""
    num_examples = int(data[0].shape[0])
    key = tf.constant([12345], tf.uint64)  # a fixed key: this times the draw, nothing more

    def draw(step):
        counter = tf.stack([tf.cast(step, tf.uint64), tf.constant(0, tf.uint64)])
        uniform = tf.raw_ops.StatelessRandomUniformV2(shape=[num_examples], key=key,
                                                      counter=counter, alg=1, dtype=tf.float64)
        index = tf.where(uniform < q)[:, 0]
        count = tf.size(index)
        return tuple(tf.pad(tf.gather(t, index), [[0, max_batch_size - count]]
                            + [[0, 0]] * (t.shape.rank - 1)) for t in data)

    return draw


def _cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_ms_per_batch(dataset):
    start, batches = _cpu_seconds(), 0
    for _ in dataset:
        batches += 1
    return 1000 * (_cpu_seconds() - start) / batches


def measure(num_examples, batch_size, steps):
    """(geometric gaps, one uniform per example): CPU ms per batch."""
    x = np.zeros((num_examples, 4), np.float32)
    y = np.zeros(num_examples, np.int64)
    q = batch_size / num_examples
    max_batch = sampling.default_max_batch_size(num_examples=num_examples,
                                                sampling_probability=q, total_steps=steps)
    ours = sampling.poisson_batches(x, y, expected_batch_size=batch_size, steps=steps)
    previous = tf.data.Dataset.range(steps).map(
        per_example_drawer((tf.constant(x), tf.constant(y)), q, max_batch),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).prefetch(tf.data.AUTOTUNE)
    return _cpu_ms_per_batch(ours), _cpu_ms_per_batch(previous)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num_examples", default="60000,1000000",
                        help="comma-separated dataset sizes N")
    parser.add_argument("--batch_size", type=int, default=256, help="expected batch size")
    parser.add_argument("--steps", type=int, default=300, help="batches drawn per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurements")
    args = parser.parse_args()
    print(f"Poisson batch draw, expected batch {args.batch_size}, {args.steps} batches per "
          f"measurement, {args.rounds} rounds; CPU ms per batch (median; all rounds)\n")
    print("| N | geometric gaps (now) | one uniform per example (before) | before / now |")
    print("|---:|---|---|---:|")
    for n in (int(v) for v in args.num_examples.split(",")):
        measure(n, args.batch_size, 20)  # warm-up: tracing, thread pools
        rounds = [measure(n, args.batch_size, args.steps) for _ in range(args.rounds)]
        now, before = ([r[i] for r in rounds] for i in (0, 1))
        print(f"| {n} | {statistics.median(now):.2f} ({', '.join(f'{v:.2f}' for v in now)}) | "
              f"{statistics.median(before):.2f} ({', '.join(f'{v:.2f}' for v in before)}) | "
              f"{statistics.median(before) / statistics.median(now):.1f} |")


if __name__ == "__main__":
    main()
