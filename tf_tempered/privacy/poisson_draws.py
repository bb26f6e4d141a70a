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
"""One step of Poisson sampling: its sizes and its draw.

q = expected batch size / N; an "epoch" is round(1/q) steps; a batch has Binomial(N, q)
members, padded to the smallest size k that no step of the run exceeds except with
probability below ``OVERFLOW_PROBABILITY`` (union bound over the steps):

    total_steps · P[Binomial(N, q) > k] < 1e-10

A step's members come from the gaps between them, which are independent Geometric(q):
O(k) uniforms a step instead of one per example (:func:`bernoulli_members`).
:mod:`tf_tempered.privacy.sampling` builds the datasets from these.

>>> default_max_batch_size(num_examples=60000, sampling_probability=256 / 60000, total_steps=234)
378
"""

import math
import numbers

from scipy import stats

from tf_tempered._compat import tf

__all__ = ["OVERFLOW_PROBABILITY", "bernoulli_members", "check_positive_int",
           "default_max_batch_size", "drawer", "poisson_sampling_probability",
           "poisson_steps_per_epoch"]

# Default bound on the probability that any step of a run samples more than
# max_batch_size examples.
OVERFLOW_PROBABILITY = 1e-10


def poisson_sampling_probability(*, num_examples, expected_batch_size=None,
                                 sampling_probability=None):
    """q from exactly one of ``expected_batch_size`` (q = expected_batch_size / N) and q.

    >>> poisson_sampling_probability(num_examples=60000, expected_batch_size=256)
    0.004266666666666667
    """
    if (isinstance(num_examples, bool) or not isinstance(num_examples, numbers.Integral)
            or num_examples <= 0):
        raise ValueError(f"num_examples must be a positive integer, got {num_examples!r}; "
                         f"the dataset needs at least one example.")
    if (expected_batch_size is None) == (sampling_probability is None):
        raise ValueError(
            f"Give exactly one of expected_batch_size and sampling_probability (got "
            f"expected_batch_size={expected_batch_size!r}, sampling_probability="
            f"{sampling_probability!r}); e.g. expected_batch_size=256.")
    if expected_batch_size is not None:
        if (isinstance(expected_batch_size, bool)
                or not isinstance(expected_batch_size, numbers.Real)
                or not 0 < expected_batch_size <= num_examples):
            raise ValueError(f"expected_batch_size must be in (0, num_examples={num_examples}]"
                             f", got {expected_batch_size!r}; use a smaller batch size.")
        return float(expected_batch_size) / num_examples
    if (isinstance(sampling_probability, bool)
            or not isinstance(sampling_probability, numbers.Real)
            or not 0 < sampling_probability <= 1):
        raise ValueError(f"sampling_probability must be in (0, 1], got "
                         f"{sampling_probability!r}; e.g. sampling_probability=0.01.")
    return float(sampling_probability)


def poisson_steps_per_epoch(*, num_examples, expected_batch_size=None,
                            sampling_probability=None):
    """Steps of one "epoch" of Poisson sampling: round(N / (q·N)) = round(1/q), at least 1.

    Halves round up. On average an epoch then touches each example about once.

    >>> poisson_steps_per_epoch(num_examples=60000, expected_batch_size=256)
    234
    >>> poisson_steps_per_epoch(num_examples=100, sampling_probability=0.4)
    3
    """
    q = poisson_sampling_probability(num_examples=num_examples,
                                     expected_batch_size=expected_batch_size,
                                     sampling_probability=sampling_probability)
    return max(1, int(math.floor(1.0 / q + 0.5)))


def default_max_batch_size(*, num_examples, sampling_probability, total_steps,
                           overflow_probability=OVERFLOW_PROBABILITY):
    """Smallest k with ``total_steps · P[Binomial(N, q) > k] < overflow_probability``.

    By the union bound, no step of the run overflows k except with probability below
    ``overflow_probability`` (default 1e-10).

    >>> default_max_batch_size(num_examples=60000, sampling_probability=256 / 60000,
    ...                        total_steps=14040)
    388
    """
    check_positive_int("total_steps", total_steps)
    if not 0 < sampling_probability <= 1:
        raise ValueError(f"sampling_probability must be in (0, 1], got "
                         f"{sampling_probability!r}.")
    if not 0 < overflow_probability < 1:
        raise ValueError(f"overflow_probability must be in (0, 1), got "
                         f"{overflow_probability!r}; e.g. 1e-10.")
    per_step = overflow_probability / total_steps
    k = int(stats.binom.isf(per_step, num_examples, sampling_probability))
    k = max(k, 0)
    while k < num_examples and stats.binom.sf(k, num_examples, sampling_probability) >= per_step:
        k += 1
    return max(1, min(k, num_examples))


def check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}; pass e.g. "
                         f"{name}=1 or larger.")


def bernoulli_members(uniform, *, num_examples, sampling_probability):
    """The sorted indices i < N with a Bernoulli(q) draw of 1, from m uniforms in [0, 1).

    The gaps between consecutive members of a Bernoulli(q) sequence are independent
    Geometric(q): gap = ⌊ln(1 − u) / ln(1 − q)⌋ has P[gap ≥ k] = (1 − q)^k, and the
    members are cumsum(gap + 1) − 1. So m uniforms give the members among the first
    examples, exactly, as long as fewer than m of them fall below N: O(m) draws a step
    instead of one per example. m members below N means there may be more (overflow):
    the caller refuses that step.

    >>> u = tf.constant([0.0, 0.5, 0.9, 0.99], tf.float64)
    >>> bernoulli_members(u, num_examples=3, sampling_probability=1.0).numpy()  # q = 1: all
    array([0, 1, 2])
    >>> bernoulli_members(u, num_examples=100, sampling_probability=0.5).numpy()  # gaps 0, 1, 3, 6
    array([ 0,  2,  6, 13])
    """
    log_keep = tf.math.log1p(tf.constant(-sampling_probability, tf.float64))  # −inf at q = 1
    gaps = tf.floor(tf.math.log1p(-tf.cast(uniform, tf.float64)) / log_keep)
    positions = tf.cumsum(gaps + 1.0) - 1.0
    return tf.cast(tf.boolean_mask(positions, positions < num_examples), tf.int64)


def drawer(data, source, *, q, num_examples, shard_index, max_batch_size, pad=True):
    """draw(step, pass) → (x, y, {"mask", "expected_batch_size"[, "sample_weight"]}), padded
    to ``max_batch_size`` rows (``pad``), or unpadded."""
    shard_examples = int(tf.nest.flatten(data)[0].shape[0])
    padded_size = max_batch_size if pad else None
    expected = tf.constant(q * num_examples, tf.float32)
    overflow_message = (
        f"poisson_batches: a step sampled more examples than max_batch_size="
        f"{max_batch_size} (N={shard_examples}, q={q:.6g}, expected "
        f"{q * shard_examples:.6g}); "
        f"pass a larger max_batch_size, or leave it None for a size that overflows with "
        f"probability < {OVERFLOW_PROBABILITY:g} over the run. Sampled count (at least):")

    def padded(tensor, count):
        if padded_size is None:  # fixed_size=False
            return tensor
        paddings = [[0, padded_size - count]] + [[0, 0]] * (tensor.shape.rank - 1)
        return tf.ensure_shape(tf.pad(tensor, paddings),
                               [padded_size] + tensor.shape.as_list()[1:])

    def draw(step, iteration):
        # A distinct Philox counter per (pass over the dataset, step); max_batch_size + 1
        # uniforms: max_batch_size + 1 members is an overflow, refused below.
        counter = tf.bitwise.left_shift(iteration, 32) + step
        uniform = source.uniform([max_batch_size + 1], counter=counter, stream=shard_index,
                                 dtype=tf.float64)
        index = bernoulli_members(uniform, num_examples=shard_examples,
                                  sampling_probability=q)
        count = tf.size(index)
        check = tf.debugging.assert_less_equal(count, max_batch_size, message=overflow_message)
        with tf.control_dependencies([check]):
            count = tf.identity(count)
        rows = tf.nest.map_structure(lambda t: padded(tf.gather(t, index), count), data)
        info = {"mask": padded(tf.ones([count], tf.float32), count),
                "expected_batch_size": expected}
        if len(rows) == 3:
            info["sample_weight"] = rows[2]
        return rows[0], rows[1], info

    return draw
