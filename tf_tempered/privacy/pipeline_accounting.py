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
"""How a tf.data pipeline without a sampling tag is accounted: the shuffle bound's passes.

The shuffle bound composes one Gaussian per pass over the data, each example at most once
per pass. Read off the pipeline (module functions): how many steps a pass takes, and how
many times each pass counts when a batch may hold an example several times (a repeat
below the batch). Batches of ``poisson_batches`` whose tag a transformation dropped count
every step as a pass; a shuffle between a repeat and the batch is refused.
"""

import warnings

import numpy as np  # noqa: F401  (used by the doctest)

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import class_weights

__all__ = ["UNKNOWN_PIPELINE_WARNING", "UNTAGGED_POISSON_WARNING", "untagged_passes",
           "untagged_steps_per_pass"]

UNKNOWN_PIPELINE_WARNING = (
    "fit on a pipeline tf_tempered did not build ({what}): its batches are accounted "
    "with the bound for shuffled batches (no amplification by subsampling; assumes each "
    "example appears at most once per epoch), which is usually much larger than the "
    "Poisson ε. "
    "Fix: fit on arrays (Poisson batches are drawn for you), or build the dataset with "
    "tf_tempered.privacy.poisson_batches (the amplified ε) or "
    "tf_tempered.privacy.shuffled_batches (shuffled, declared as such).")

UNTAGGED_POISSON_WARNING = (
    "fit on batches of tf_tempered.privacy.poisson_batches (a mask in each batch's info "
    "dict) whose Poisson tag a transformation dropped (.cache(), .shuffle(), .filter(), "
    ".concatenate(), ... keep only .map(), .prefetch(), .take(), .skip() and .repeat() "
    "it), or built by hand: each step is accounted as a Gaussian mechanism of its own (no "
    "amplification by subsampling), a much larger ε than the Poisson one. Fix: fit on "
    "poisson_batches(...) with only those transformations (it draws a new batch every "
    "step already), or on arrays.")


def untagged_passes(warned, x):
    """(steps per pass, pass weight) of an untagged pipeline; batches of poisson_batches whose
    tag a transformation dropped (.cache(), .shuffle(), .filter(), .concatenate()) count
    every step as a pass: no pass holds each example once, nor can their sampling be read."""
    if class_weights.is_poisson_pipeline(x):
        if "untagged poisson" not in warned:  # the model's set of warnings given
            warned.add("untagged poisson")
            warnings.warn(UNTAGGED_POISSON_WARNING, UserWarning, stacklevel=5)
        return 1, 1
    return untagged_steps_per_pass(x)


# One output per input element: the count of examples a pass holds is kept through them.
_ONE_TO_ONE = {"MapDataset", "ParallelMapDataset", "ShuffleDataset", "PrefetchDataset",
               "OptionsDataset", "CacheDataset"}


def untagged_steps_per_pass(dataset):
    """(batches in one pass over an untagged pipeline's data, times each pass counts), for
    the shuffle bound.

    Read off its ``.batch()`` when the examples batched are counted (``ds.batch(16)
    .repeat()`` of 64 examples: 4, so a fit's epoch of 8 steps is two passes), or, for
    ``ds.shuffle(n).repeat().batch(16)`` or ``ds.repeat(3).batch(16)``, when the repeated
    data is (⌊n/16⌋ steps, a pass begun every so many at most; n/16 when the batch is
    larger); 1 when the pipeline repeats without end and neither is known (every step is
    then accounted as a pass: no assumption left); None otherwise (one pass per epoch, the
    documented assumption).

    A batch of a repeat spans two passes when B does not divide n (or more when B > n)
    and may hold an example m times (m ≤ ⌈B/n⌉ + 1): its Gaussian then has sensitivity
    m·C. Summed over the steps, m² ≤ m_max · m, so each pass touched counts m_max times.
    A shuffle between the repeat and the batch mixes passes without a bound on m: refused.

    >>> ds = tf.data.Dataset.from_tensor_slices(np.arange(10.0))
    >>> untagged_steps_per_pass(ds.batch(4).repeat()), untagged_steps_per_pass(ds.batch(4, True))
    ((3, 1), (2, 1))
    >>> untagged_steps_per_pass(ds.shuffle(10).repeat().batch(4)), untagged_steps_per_pass(
    ...     ds.repeat(3).batch(5)), untagged_steps_per_pass(ds.repeat().batch(25))
    ((2, 2), (2, 1), (0.4, 4))
    """
    batching = keras_bridge.batching_of(dataset)
    # A repeat below the batch first: ds.repeat(3).batch(B) batches 3N rows, a pass is N.
    repeated = _repeat_below_batch(dataset) if batching is not None else None
    if repeated is not None:
        return _passes_of_repeated(repeated, batching[0])
    if batching is not None and batching[2] is not None:
        size, drop, rows = batching
        return max(1, rows // size if drop else -(-rows // size)), 1
    if isinstance(dataset, tf.data.Dataset) and \
            int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY):
        return 1, 1
    return None, 1


def _passes_of_repeated(repeated, size):
    rows, shuffled, skipped = repeated
    if shuffled or rows is None:
        raise ValueError(
            "fit on a tf.data pipeline that " + (
                "shuffles its examples after repeating them (ds.repeat().shuffle(k)"
                ".batch(B)): copies of an example from several passes can meet in one batch, "
                "as many as the shuffle buffer allows" if shuffled else
                "repeats examples before batching them through transformations that hide "
                "how many a pass holds (a filter, an unbatch, a flat_map, a concatenation): "
                "a batch may hold an example several times") + ", so no bound on one example's share of a "
            "step can be read off it. Fix: shuffle before repeating "
            "(ds.shuffle(n).repeat().batch(B)), or batch before repeating "
            "(ds.shuffle(n).batch(B).repeat()), or use tf_tempered.privacy.shuffled_batches "
            "or poisson_batches (the amplified ε).")
    aligned = not skipped and (rows % size == 0 or size % rows == 0)
    most = -(-size // rows) + (0 if aligned else 1)  # an example's copies in one batch
    return (rows // size if size <= rows else rows / size), most


def _repeat_below_batch(dataset):
    """(the examples of one pass of the ``.repeat()`` below the pipeline's ``.batch()``, or
    None if no count can be read for it; whether a shuffle lies between them; whether a
    ``.skip()`` does, which moves the passes' starts off the batches'), or None if no repeat
    lies below the batch. Transformations that keep one output per input (and a
    ``.take()``) keep the count; any other (an unbatch and rebatch, a filter, a flat_map, a
    concatenation) leaves it unknown, in any of their inputs."""
    below_batch = shuffled = skipped = uncounted = False
    pending = [(dataset, 0)]
    while pending:
        dataset, depth = pending.pop()
        kind = keras_bridge.dataset_kind(dataset)
        inputs = keras_bridge.dataset_inputs(dataset)
        if depth > 64:  # as deep as sampling_of looks
            continue
        if kind == "RepeatDataset" and below_batch:
            rows = -1 if uncounted or len(inputs) != 1 else int(inputs[0].cardinality())
            return (rows if rows > 0 else None), shuffled, skipped
        if not below_batch:
            if len(inputs) != 1:
                return None  # above the batch: one chain of transformations only
            below_batch = kind in ("BatchDataset", "ParallelBatchDataset")
        elif kind == "ShuffleDataset":
            shuffled = True
        elif kind == "SkipDataset":
            skipped = True
        elif kind not in _ONE_TO_ONE and kind != "TakeDataset":
            uncounted = True  # the count of examples a pass holds is no longer read
        pending.extend((source, depth + 1) for source in inputs)
    return None
