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

import fractions
import warnings
from typing import NamedTuple

import numpy as np  # noqa: F401  (used by the doctest)

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import class_weights, user_frame

__all__ = ["SPARSE_ARRAYS_WARNING", "UNKNOWN_PIPELINE_WARNING", "UNTAGGED_POISSON_WARNING",
           "untagged_passes", "assumed_epoch_note", "untagged_steps_per_pass"]

UNKNOWN_PIPELINE_WARNING = (
    "fit on a pipeline tf_tempered did not build ({what}): its batches are accounted "
    "with the bound for shuffled batches (no amplification by subsampling; assumes each "
    "example appears at most once per epoch), which is usually much larger than the "
    "Poisson ε. "
    "Fix: fit on arrays (Poisson batches are drawn for you), or build the dataset with "
    "tf_tempered.privacy.poisson_batches (the amplified ε) or "
    "tf_tempered.privacy.shuffled_batches (shuffled, declared as such).")

# Sparse arrays given to fit are batched by Keras as a pipeline it builds (probe D3, F6:
# the fix above told them to fit on arrays, as they had).
SPARSE_ARRAYS_WARNING = (
    "fit on sparse arrays ({what}): Keras batches them itself, not as Poisson samples, so "
    "they are accounted with the bound for shuffled batches (no amplification by "
    "subsampling), which is usually much larger than the Poisson ε. Fix: fit on dense "
    "arrays (x.toarray(), tf.sparse.to_dense(x)) to have Poisson batches drawn, or "
    "build the dataset with tf_tempered.privacy.poisson_batches.")

UNTAGGED_POISSON_WARNING = (
    "fit on batches of tf_tempered.privacy.poisson_batches (a mask in each batch's info "
    "dict) whose Poisson tag a transformation dropped (.cache(), .shuffle(), .filter(), "
    ".concatenate(), ... keep only .map(), .prefetch(), .take(), .skip() and .repeat() "
    "it), or built by hand: each step is accounted as a Gaussian mechanism of its own (no "
    "amplification by subsampling), a much larger ε than the Poisson one. Fix: fit on "
    "poisson_batches(...) with only those transformations (it draws a new batch every "
    "step already), or on arrays.")


def assumed_epoch_note(x, steps_per_epoch):
    """What the once-an-epoch assumption means for a source fit reads by steps_per_epoch
    whose passes cannot be read (a Python generator, a PyDataset, an iterator, a
    from_generator dataset): said with its numbers, since an endless source that cycles
    over the data in fewer batches spends more than the ε logged (probe U, F3)."""
    if not steps_per_epoch or (isinstance(x, tf.data.Dataset)
                               and untagged_steps_per_pass(x)[0] is not None):
        return ""
    return (f" With steps_per_epoch={steps_per_epoch}: the ε logged assumes no example "
            f"appears twice in an epoch's {steps_per_epoch} batches; a source that passes "
            "over the data in fewer batches (an endless generator cycling over N examples "
            "in N/B batches) spends more. Declare the passes: fit on "
            "tf_tempered.privacy.shuffled_batches(x, y, batch_size=B).repeat().")


def untagged_passes(warned, x):
    """(steps per pass, pass weight) of an untagged pipeline; batches of poisson_batches whose
    tag a transformation dropped (.cache(), .shuffle(), .filter(), .concatenate()) count
    every step as a pass: no pass holds each example once, nor can their sampling be read."""
    if class_weights.is_poisson_pipeline(x):
        if "untagged poisson" not in warned:  # the model's set of warnings given
            warned.add("untagged poisson")
            warnings.warn(UNTAGGED_POISSON_WARNING, UserWarning,
                          stacklevel=user_frame.user_stacklevel())
        return 1, 1
    return untagged_steps_per_pass(x)


# Over batches, above the repeat or the batch: they keep which batch is a pass's k-th (a
# take only ends the stream early).
_KEEPS_ORDER = keras_bridge.ONE_TO_ONE | {"TakeDataset"}
# Under the batch, above the repeat: a pass's count of examples can still be read.
_COUNTABLE_ABOVE_REPEAT = keras_bridge.ONE_TO_ONE | {"TakeDataset", "ShuffleDataset",
                                                     "SkipDataset"}


class _Census(NamedTuple):
    """What one walk of a pipeline finds: every transformation's kind, and how many paths
    reach the dataset read the most (zip((d, d)), d.concatenate(d): each path gives its
    examples again)."""

    kinds: frozenset
    most_uses: int

    def repeats(self):
        return "RepeatDataset" in self.kinds


def _census(datasets):
    """The _Census of the pipelines ``datasets`` (at most 512 nodes, 64 deep)."""
    pending, kinds, uses, seen = [(d, 0) for d in datasets], set(), {}, 0
    while pending and seen < 512:
        dataset, depth = pending.pop()
        seen += 1
        kinds.add(keras_bridge.dataset_kind(dataset))
        uses[id(dataset)] = uses.get(id(dataset), 0) + 1
        if depth < 64:
            pending.extend((source, depth + 1) for source in keras_bridge.dataset_inputs(dataset))
    return _Census(frozenset(kinds), max(uses.values(), default=1))


def untagged_steps_per_pass(dataset):
    """(batches in one pass over an untagged pipeline's data, times each pass counts), for
    the shuffle bound; (None, 1): one pass per epoch, the documented assumption.

    Read off two forms: ``ds.batch(16).repeat()`` of 64 examples, a pass every 4 batches
    (so an epoch of 8 steps is two passes); and a repeat below the batch,
    ``ds.shuffle(n).repeat().batch(16)`` or ``ds.repeat(3).batch(16)``: ⌊n/16⌋ steps a
    pass (n/16 when the batch is larger), where a batch that spans two passes (B does not
    divide n; more when B > n) may hold an example m ≤ ⌈B/n⌉ + 1 times, a Gaussian of
    sensitivity m·C: summed over the steps m² ≤ m_max · m, so each pass counts m_max times.
    Any other pipeline that repeats its batches, takes the same dataset twice (K times:
    a batch may hold an example K times) or overlaps its windows counts every step as a
    pass (times K²). A repeat below a batch in any other form, or a shuffle between a
    repeat and the batch, puts copies of an example in one batch without a bound read off
    the pipeline: refused.

    >>> ds = tf.data.Dataset.from_tensor_slices(np.arange(10.0))
    >>> untagged_steps_per_pass(ds.batch(4).repeat()), untagged_steps_per_pass(ds.batch(4, True))
    ((3, 1), (2, 1))
    >>> untagged_steps_per_pass(ds.shuffle(10).repeat().batch(4)), untagged_steps_per_pass(
    ...     ds.repeat(3).batch(5)), untagged_steps_per_pass(ds.repeat().batch(25))
    ((2, 2), (2, 1), (Fraction(2, 5), 4))
    >>> untagged_steps_per_pass(ds.batch(4).repeat(3).skip(1)), untagged_steps_per_pass(
    ...     tf.data.Dataset.zip((ds, ds)).batch(4))
    ((1, 1), (1, 4))
    """
    top, below = _top_chain(dataset)
    whole = _census([dataset])
    copies, overlaps = whole.most_uses, bool(whole.kinds & keras_bridge.OVERLAPPING)
    if below is None:  # no batch read off the top of the pipeline
        return (1, copies ** 2) if whole.repeats() or copies > 1 or overlaps else (None, 1)
    batch_index = len(top) - 1
    repeat_below = _repeat_under(below)
    if repeat_below is not None:
        return _passes_below(top, batch_index, repeat_below)
    batching = keras_bridge.batching_of(top[batch_index])
    if copies > 1 or overlaps or _census(below).kinds & keras_bridge.GROUPING:
        return 1, copies ** 2
    kinds = [keras_bridge.dataset_kind(d) for d in top[:batch_index]]
    if "RepeatDataset" in kinds:
        at = kinds.index("RepeatDataset")
        if (kinds.count("RepeatDataset") == 1 and set(kinds[:at]) <= _KEEPS_ORDER
                and set(kinds[at + 1:]) <= keras_bridge.ONE_TO_ONE and batching and batching[2]):
            size, drop, rows = batching
            return max(1, rows // size if drop else -(-rows // size)), 1
        return 1, 1  # batches repeated in an order that is not read: every step a pass
    if batching is not None and batching[2] is not None:
        size, drop, rows = batching
        return max(1, rows // size if drop else -(-rows // size)), 1
    return None, 1


def _top_chain(dataset):
    """([the pipeline's datasets from the top down to its first grouping op], that op's
    input), or ([...], None) when a transformation of several inputs or none comes first."""
    chain = []
    for _ in range(64):  # as deep as sampling_of looks
        chain.append(dataset)
        inputs = keras_bridge.dataset_inputs(dataset)
        if keras_bridge.dataset_kind(dataset) in keras_bridge.GROUPING:
            return chain, inputs
        if len(inputs) != 1:
            return chain, None
        dataset = inputs[0]
    return chain, None


def _repeat_under(datasets):
    """(the path from the batch's input down to the first repeat under it, as datasets), or
    None if nothing under the batch repeats."""
    pending = [[d] for d in datasets]
    while pending:
        path = pending.pop()
        if keras_bridge.dataset_kind(path[-1]) == "RepeatDataset":
            return path
        if len(path) < 64:
            pending.extend(path + [d] for d in keras_bridge.dataset_inputs(path[-1]))
    return None


def _passes_below(top, batch_index, path):
    """(steps per pass, pass weight) of a repeat below the batch, reached by ``path``."""
    kinds = {keras_bridge.dataset_kind(d) for d in path[:-1]}
    under = keras_bridge.dataset_inputs(path[-1])
    below_repeat = _census(under)
    batching = keras_bridge.batching_of(top[batch_index])
    countable = (keras_bridge.dataset_kind(top[batch_index]) in keras_bridge.BATCH
                 and batching is not None and kinds <= _COUNTABLE_ABOVE_REPEAT
                 and len(under) == 1 and not below_repeat.repeats()
                 and below_repeat.most_uses == 1
                 and not below_repeat.kinds & keras_bridge.GROUPING)
    rows = int(under[0].cardinality()) if countable else -1
    if "ShuffleDataset" in kinds or rows <= 0:
        _refuse_unbounded_copies(shuffled="ShuffleDataset" in kinds)
    per_pass, weight = _passes_of_repeated(rows, batching[0], skipped="SkipDataset" in kinds)
    above = {keras_bridge.dataset_kind(d) for d in top[:batch_index]}
    if not above <= _KEEPS_ORDER:  # batches shuffled, skipped or filtered: every step a pass
        return 1, weight ** 2
    return per_pass, weight


def _refuse_unbounded_copies(shuffled):
    how = ("shuffles its examples after repeating them (ds.repeat().shuffle(k).batch(B)): "
           "copies of an example from several passes can meet in one batch, as many as the "
           "shuffle buffer allows" if shuffled else
           "repeats examples before batching them through transformations that hide how "
           "many a pass holds (a filter, an unbatch, a flat_map, a concatenation): a batch "
           "may hold an example several times")
    raise ValueError(
        f"fit on a tf.data pipeline that {how}, so no bound on one example's share of a "
        "step can be read off it. Fix: shuffle before repeating "
        "(ds.shuffle(n).repeat().batch(B)), or batch before repeating "
        "(ds.shuffle(n).batch(B).repeat()), or use tf_tempered.privacy.shuffled_batches "
        "or poisson_batches (the amplified ε).")


def _passes_of_repeated(rows, size, skipped):
    """(steps per pass, pass weight) of batches of ``size`` over ``rows`` examples repeated:
    a batch spanning two passes may hold an example ⌈size/rows⌉ (+1 unless aligned) times."""
    aligned = not skipped and (rows % size == 0 or size % rows == 0)
    most = -(-size // rows) + (0 if aligned else 1)  # an example's copies in one batch
    # A fraction, exact: as a float, 3/11 made ceil(15 / (3/11)) 56 passes for 55 (probe E3).
    return (rows // size if size <= rows else fractions.Fraction(rows, size)), most
