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
"""Poisson sampling for DP-SGD, the sampling that the Poisson ε of accounting assumes.

At every step each of the N examples is included independently with probability
``q``, so a batch has Binomial(N, q) examples, ``q·N`` on average. To keep shapes
static (no retracing, XLA-friendly), each batch is padded with zero rows to a fixed
``max_batch_size`` and carries a mask. Every element of the dataset is::

    (x_batch, y_batch, {"mask": mask, "expected_batch_size": e})

with ``x_batch`` [max_batch_size, ...] (zero padding), ``y_batch`` [max_batch_size, ...],
``mask`` float32 [max_batch_size] (1.0 real row, 0.0 padding) and ``e = q·N`` a
float32 scalar. The matching ε is ``compute_epsilon(num_examples=N, batch_size=q·N,
steps=<number of steps>, sampling="poisson", ...)``.

Membership is secret: drawn from a key read from the OS's entropy (see
:mod:`tf_tempered.privacy.randomness`), never from a seed, because amplification by
subsampling, hence that ε, holds only if nobody can tell which examples a step used.

Several replicas or workers (``tf.distribute``): :func:`distributed_poisson_batches`
gives replica ``r`` of ``R`` the shard ``x[r::R]`` (``num_shards=R, shard_index=r``
of :func:`poisson_batches`) and samples it with the SAME q, from its own Philox
stream (``stream=r`` of the key; on another worker another secret key as well).
Why the single-machine ε is still the right one: the shards are disjoint and cover
the N examples, and within a step every example's inclusion is a Bernoulli(q) draw
independent of every other example's (independent within a shard by construction,
across shards because the streams, or keys, are independent). The union of the
replicas' samples, which is the step's global batch, therefore includes each of
the N examples independently with probability q: exactly a Poisson sample of the
whole dataset, the sampling ``compute_epsilon(num_examples=N, batch_size=q·N,
sampling="poisson")`` assumes. Each replica pads its own sample to its own
``max_batch_size`` with a mask, and every replica carries the GLOBAL expected
batch size q·N, the normaliser of the summed update (see
:mod:`tf_tempered.privacy.step.replicas`). Splitting one padded global batch among the
replicas instead would put the padding on the last replicas (and tf.distribute
cannot split the scalar expected batch size), hence a per-replica sampler.
"""

import numbers

import numpy as np  # noqa: F401  (used by the doctests)

from tf_tempered._compat import tf
from tf_tempered.privacy import data_sampling, randomness
# One step's sizes (re-exported: part of this module's API) and its draw (poisson_draws.py).
from tf_tempered.privacy.poisson_draws import (OVERFLOW_PROBABILITY, check_positive_int,
                                               default_max_batch_size, drawer,
                                               poisson_sampling_probability,
                                               poisson_steps_per_epoch)

__all__ = [
    "OVERFLOW_PROBABILITY",
    "poisson_sampling_probability",
    "poisson_steps_per_epoch",
    "default_max_batch_size",
    "poisson_batches",
    "distributed_poisson_batches",
]

def poisson_batches(x, y, *, sample_weight=None, expected_batch_size=None,
                    sampling_probability=None, epochs=None, steps=None, max_batch_size=None,
                    fixed_size=True, seed=None, insecure_dp_seed=None, num_shards=1,
                    shard_index=0):
    """tf.data.Dataset of Poisson-sampled, zero-padded batches of (x, y) with a mask.

    Each step includes each example independently with probability q (a Bernoulli
    draw per example per step). Give exactly one of ``expected_batch_size``
    (q = expected_batch_size / N) and ``sampling_probability``, and exactly one of
    ``epochs`` (steps = epochs · round(1/q)) and ``steps``. Batches are padded to
    ``max_batch_size`` (default: see ``default_max_batch_size``); a step that samples
    more raises ``InvalidArgumentError`` naming max_batch_size, never drops examples.
    ``x`` and ``y`` may be structures (dicts, tuples) of arrays, as for ``fit``;
    ``sample_weight`` (one weight per example, ≥ 0) rides along as the info dict's
    ``"sample_weight"``. The dataset is tagged as Poisson-sampled, so a private model's
    ``fit`` accounts it with the amplified ε of ``compute_epsilon(num_examples=N,
    batch_size=q·N, steps=<steps>)``.

    ``num_shards=R, shard_index=r`` (for one replica of R; see
    :func:`distributed_poisson_batches`) samples only the examples ``x[r::R]``, with
    the same q and its own Philox stream; ``expected_batch_size`` stays the global
    q·N, and the default ``max_batch_size`` bounds the overflow of all R shards.

    ``fixed_size=False`` leaves the batches unpadded: each holds exactly the sampled
    examples (mask all ones), so a step computes on about q·N rows instead of
    max_batch_size (MNIST, expected 256: 256 against 380 rows). The update and the ε
    are the same; what changes is that the step's time and memory now follow the
    batch size, which depends on the secret membership: the ε covers the model and
    its updates, not someone timing the steps. Batches of varying shape are traced
    once (batch dimension None); with ``jit_compile=True``, XLA compiles once per
    batch size met. Not with ``num_shards`` > 1 or ``max_batch_size``.

    Membership is secret: the draws come from a key read from the OS's entropy when
    the dataset is built, at a fresh counter for every pass over the dataset (each
    epoch draws new batches), and not from ``seed``, ``keras.utils.set_random_seed``
    or ``tf.random.set_seed``. Amplification by subsampling, which the Poisson ε
    rests on, needs that nobody can predict which examples a step used. ``seed`` is
    therefore refused (ValueError). ``insecure_dp_seed=K`` (an int) derives the key
    from K for bit-for-bit reproducible batches in debugging and tests: NOT private,
    the ε does not hold (warns once per process).

    >>> ds = poisson_batches(np.ones((10, 2)), np.arange(10), expected_batch_size=5,
    ...                      steps=3, max_batch_size=10)
    >>> x_batch, y_batch, info = next(iter(ds))
    >>> x_batch.shape, y_batch.shape, info["mask"].shape, float(info["expected_batch_size"])
    (TensorShape([10, 2]), TensorShape([10]), TensorShape([10]), 5.0)
    >>> float(tf.reduce_sum(x_batch[:, 0])) == float(tf.reduce_sum(info["mask"]))
    True
    """
    if seed is not None:
        raise ValueError(
            f"poisson_batches no longer takes seed (got seed={seed!r}): batch membership "
            f"must be secret for amplification by subsampling (the Poisson ε) to hold, so "
            f"a seed that is printed or saved would void it. Fix: drop seed= (membership "
            f"is then keyed by OS entropy), or, for a reproducible NON-private debug run, "
            f"pass insecure_dp_seed={seed!r}.")
    data, num_examples = _as_examples(x, y, sample_weight)
    _check_shards(num_shards, shard_index, num_examples)
    _check_fixed_size(fixed_size, max_batch_size, num_shards)
    q = poisson_sampling_probability(num_examples=num_examples,
                                     expected_batch_size=expected_batch_size,
                                     sampling_probability=sampling_probability)
    steps = _total_steps(epochs, steps, num_examples=num_examples, sampling_probability=q)
    if num_shards > 1:  # this replica's examples; q and q·N stay global
        data = tf.nest.map_structure(lambda t: t[shard_index::num_shards], data)
    # Unpadded batches keep the bound too: the sampler draws one uniform per possible member.
    max_batch_size = _max_batch_size(max_batch_size, data, q=q, steps=steps,
                                     num_shards=num_shards)
    source = randomness.DPRandomness("poisson", insecure_dp_seed=insecure_dp_seed)
    draw = drawer(data, source, q=q, num_examples=num_examples, shard_index=shard_index,
                   max_batch_size=max_batch_size, pad=fixed_size)

    return data_sampling.tag_dataset(
        _padded_batches(source, draw, steps),
        data_sampling.SamplingTag("poisson", num_examples, q * num_examples, q, steps,
                                  fixed_size=fixed_size))


def _total_steps(epochs, steps, *, num_examples, sampling_probability):
    """The steps of the run: ``steps``, or ``epochs · round(1/q)``; exactly one is given."""
    if (epochs is None) == (steps is None):
        raise ValueError(f"Give exactly one of epochs and steps (got epochs={epochs!r}, "
                         f"steps={steps!r}); e.g. epochs=10.")
    if steps is None:
        check_positive_int("epochs", epochs)
        steps = int(epochs) * poisson_steps_per_epoch(num_examples=num_examples,
                                                      sampling_probability=sampling_probability)
    check_positive_int("steps", steps)
    if steps >= 2 ** 32:  # the Philox counter holds (pass, step) as two 32-bit halves
        raise ValueError(f"steps must be below 2**32, got {steps}; split the run.")
    return int(steps)


def _max_batch_size(max_batch_size, shard_data, *, q, steps, num_shards):
    """The padded batch size: as given, else the default bound over all shards' steps."""
    if max_batch_size is None:  # over all shards' steps (union bound)
        shard_examples = int(tf.nest.flatten(shard_data)[0].shape[0])
        max_batch_size = default_max_batch_size(num_examples=shard_examples,
                                                sampling_probability=q,
                                                total_steps=steps * num_shards)
    check_positive_int("max_batch_size", max_batch_size)
    return int(max_batch_size)


def _padded_batches(source, draw, steps):
    """The dataset of ``steps`` padded batches ``draw((step, pass counter))`` per pass."""
    # The one-element map runs once per pass over the dataset (each epoch of fit):
    # a new counter value, hence new batches, every pass.
    @tf.autograph.experimental.do_not_convert
    def new_pass(_):
        return source.next_counter()

    @tf.autograph.experimental.do_not_convert
    def steps_of_pass(iteration):
        return tf.data.Dataset.range(steps).map(
            tf.autograph.experimental.do_not_convert(lambda step: (step, iteration)))

    dataset = tf.data.Dataset.range(1).map(new_pass).flat_map(steps_of_pass)
    # flat_map hides the length; Keras and PrivacyBudget need the steps per epoch.
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    dataset = dataset.map(draw, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _as_examples(x, y, sample_weight):
    """((x, y[, sample_weight]) as tensors, N), checked to have N rows each."""
    data = tf.nest.map_structure(tf.convert_to_tensor, (x, y) if sample_weight is None
                                 else (x, y, sample_weight))
    leaves = tf.nest.flatten(data)
    first = leaves[0]
    if first.shape.rank == 0 or first.shape[0] is None:
        raise ValueError(f"x must have a leading example dimension, got shape {first.shape}.")
    num_examples = int(first.shape[0])
    for leaf in leaves[1:]:
        if leaf.shape.rank == 0 or leaf.shape[0] != num_examples:
            raise ValueError(f"y must have one row per example of x ({num_examples}), and "
                             f"so must sample_weight; got shape {leaf.shape}. Fix: pass "
                             "arrays aligned with x.")
    return data, num_examples


def _check_fixed_size(fixed_size, max_batch_size, num_shards):
    if not isinstance(fixed_size, bool):
        raise ValueError(f"fixed_size must be True or False, got {fixed_size!r}.")
    if not fixed_size and max_batch_size is not None:
        raise ValueError(f"max_batch_size={max_batch_size!r} is the size batches are padded "
                         "to, and fixed_size=False does not pad. Fix: drop one of them.")
    if not fixed_size and num_shards > 1:
        raise ValueError("fixed_size=False is not supported with several shards (replicas "
                         "need batches of one shape). Fix: fixed_size=True.")


def _check_shards(num_shards, shard_index, num_examples):
    check_positive_int("num_shards", num_shards)
    if (isinstance(shard_index, bool) or not isinstance(shard_index, numbers.Integral)
            or not 0 <= shard_index < num_shards):
        raise ValueError(f"shard_index must be an integer in [0, num_shards={num_shards}), "
                         f"got {shard_index!r}.")
    if num_shards > randomness.MAX_STREAMS:
        raise ValueError(f"num_shards={num_shards} exceeds the {randomness.MAX_STREAMS} "
                         "independent Philox streams of one key. Fix: fewer shards (one "
                         "per replica under a strategy).")
    if num_shards > num_examples:
        raise ValueError(f"num_shards={num_shards} exceeds the {num_examples} examples; "
                         f"every shard needs at least one example.")


def distributed_poisson_batches(strategy, x, y, **kwargs):
    """Poisson batches for every replica of ``strategy`` (a ``tf.distribute`` dataset).

    Replica r of R samples its shard ``x[r::R]`` with the same q (see the module
    docstring for why the union is a Poisson sample of all N examples, and the
    single-device ε holds); takes :func:`poisson_batches`' arguments (q, ``steps``
    per pass, ``max_batch_size`` per replica, ``insecure_dp_seed``). Every worker of a
    MultiWorkerMirroredStrategy must pass the same x, y. The dataset repeats (every
    pass draws new batches): train with ``model.fit(dataset, epochs=E,
    steps_per_epoch=<steps>)``, and account for E·steps steps of q on N examples.
    """
    for name in ("num_shards", "shard_index"):
        if name in kwargs:
            raise ValueError(f"distributed_poisson_batches chooses {name} per replica; "
                             f"do not pass it.")

    def per_worker(context):
        total = context.num_replicas_in_sync
        local = total // context.num_input_pipelines
        first = context.input_pipeline_id * local
        shards = [poisson_batches(x, y, num_shards=total, shard_index=first + j, **kwargs)
                  for j in range(local)]
        if local == 1:
            return shards[0].repeat()
        # tf.distribute hands a worker's elements to its replicas in turn.
        return tf.data.Dataset.choose_from_datasets(
            shards, tf.data.Dataset.range(local).repeat(), stop_on_empty_dataset=True).repeat()

    _, num_examples = _as_examples(x, y, kwargs.get("sample_weight"))
    q = poisson_sampling_probability(
        num_examples=num_examples, expected_batch_size=kwargs.get("expected_batch_size"),
        sampling_probability=kwargs.get("sampling_probability"))
    return data_sampling.tag_dataset(
        strategy.distribute_datasets_from_function(per_worker),
        data_sampling.SamplingTag("poisson", num_examples, q * num_examples, q, None))
