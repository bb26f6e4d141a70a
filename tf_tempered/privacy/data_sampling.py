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
"""Which sampling drew a dataset's batches: the tag the accounting reads.

:func:`~tf_tempered.privacy.sampling.poisson_batches` (and ``distributed_poisson_batches``,
``augmult_batches`` of them) tag the datasets they return as Poisson, with q and N;
:func:`shuffled_batches` tags its own as shuffled (each example at most once per pass).
A dataset made from a tagged one by transformations that keep what the tag says keeps
it (:func:`sampling_of` walks back through them); anything else is untagged, and
training on it is accounted with the bound for shuffled batches, with a warning
(pipeline_accounting.py).

>>> ds = shuffled_batches(np.arange(10.0), np.arange(10), batch_size=4)
>>> tag = sampling_of(ds.prefetch(1))
>>> tag.kind, tag.num_examples, tag.batch_size
('shuffle', 10, 4)
>>> sampling_of(ds.unbatch().batch(4)) is None  # rebatched: who knows
True
"""

import dataclasses
from typing import Optional

import numpy as np  # noqa: F401  (used by the doctest)

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import randomness

__all__ = ["SamplingTag", "tag_dataset", "sampling_of", "shuffled_batches", "tag_copies",
           "copies_of", "copies_below", "refuse_mismatched_copies", "made_from_poisson_batches"]

_ATTRIBUTE = "_tf_tempered_sampling"

# tf.data transformations that keep each batch as drawn (and, for Poisson, draw anew
# on every pass): a tag survives them. Caching or rebatching does not keep it: a
# cached Poisson batch is reused, not drawn again; a rebatched one is another batch.
_KEEPS = {
    "poisson": (keras_bridge.ONE_TO_ONE - {"CacheDataset"})
               | {"TakeDataset", "SkipDataset", "RepeatDataset"},
    # Repeated, shuffled batches pass over the data again (reshuffled): the fit counts
    # ceil(steps / steps_per_pass) passes at least. Not a take: repeated, its passes are
    # shorter than the tag's.
    "shuffle": keras_bridge.ONE_TO_ONE | {"RepeatDataset"},
}


# On a dataset whose batches hold K consecutive copies of each example (augmult_batches).
_COPIES = "_tf_tempered_copies"
# Transformations that keep each batch's rows as they are (batches reordered, skipped or
# repeated whole included).
_KEEPS_ROWS = keras_bridge.ONE_TO_ONE | {"TakeDataset", "SkipDataset", "RepeatDataset",
                                         "ShuffleDataset", "FilterDataset"}


def tag_copies(dataset, multiplicity):
    """Returns ``dataset`` marked as holding ``multiplicity`` consecutive copies of each
    example in every batch."""
    keras_bridge.set_untracked(dataset, _COPIES, int(multiplicity))
    return dataset


def copies_of(dataset, _depth=0):
    """The copies of each example a dataset's batches were marked to hold (tag_copies), on
    it or on the dataset it was made from by transformations that keep the batches' rows;
    None if unmarked.

    >>> ds = tag_copies(tf.data.Dataset.range(8).batch(4), 2)
    >>> copies_of(ds.prefetch(1).repeat()), copies_of(ds.unbatch().batch(4))
    (2, None)
    """
    found = vars(dataset).get(_COPIES) if hasattr(dataset, "__dict__") else None
    if found is not None or _depth > 64:
        return found
    inputs = keras_bridge.dataset_inputs(dataset)
    if len(inputs) != 1 or keras_bridge.dataset_kind(dataset) not in _KEEPS_ROWS:
        return None
    return copies_of(inputs[0], _depth + 1)


def copies_below(dataset):
    """The copies marked anywhere below ``dataset`` in its pipeline (through any
    transformation: an unbatch and rebatch of augmult batches regroups their copies), or
    None."""
    pending = [(dataset, 0)]
    while pending:
        node, depth = pending.pop()
        found = vars(node).get(_COPIES) if hasattr(node, "__dict__") else None
        if found is not None:
            return found
        if depth < 64:
            pending.extend((d, depth + 1) for d in keras_bridge.dataset_inputs(node))
    return None


@dataclasses.dataclass(frozen=True)
class SamplingTag:
    """How a dataset's batches were drawn.

    kind: "poisson" (each example in each batch with probability q, secret membership)
      or "shuffle" (each example at most once per pass over the dataset).
    num_examples: N; sampling_probability: q (Poisson); batch_size: the (expected)
    batch size; steps_per_pass: batches in one pass; fixed_size: False for unpadded
    Poisson batches (their size varies from step to step).
    """

    kind: str
    num_examples: int
    batch_size: float
    sampling_probability: Optional[float] = None
    steps_per_pass: Optional[int] = None
    fixed_size: bool = True


def refuse_mismatched_copies(multiplicity, x):
    """Refuses batches whose copies of each example differ from what the model clips as one:
    K different examples clipped together (microbatches, a larger ε than the one logged),
    or one example's K copies clipped apart (it moves the clipped sum by K·C)."""
    declared = copies_of(x) if isinstance(x, tf.data.Dataset) else None
    if declared is None and isinstance(x, tf.data.Dataset) and copies_below(x):
        raise ValueError(
            "Batches made from tf_tempered.augment.augmult_batches by a transformation that "
            "regroups their rows (an unbatch, a rebatch, ...): an example's copies may no longer "
            "be consecutive in one batch, so they cannot be clipped together as one example. "
            "Fix: apply augmult_batches last, to batches (e.g. of poisson_batches), and train "
            "with make_private(..., augmentation_multiplicity=K).")
    if (declared or 1) == multiplicity:
        return
    if declared is None:
        raise ValueError(
            f"augmentation_multiplicity={multiplicity}: the DP step clips each {multiplicity} "
            "consecutive rows together as one example's copies, but these batches were not "
            f"made by tf_tempered.augment.augmult_batches(..., multiplicity={multiplicity}): "
            f"{multiplicity} different examples would be clipped together, a larger ε than "
            "the one logged. Fix: fit on augmult_batches(..., multiplicity="
            f"{multiplicity}), or, for batches of your own holding each example's copies "
            f"consecutively, tf_tempered.augment.declare_copies(dataset, multiplicity="
            f"{multiplicity}).")
    raise ValueError(
        f"Batches holding {declared} copies of each example (augmult_batches(..., "
        f"multiplicity={declared})) on a model made private with augmentation_multiplicity="
        f"{multiplicity}: each example's copies must be clipped together as one (else one "
        f"example moves the clipped sum by up to {declared}·C against noise for C). Fix: "
        f"make_private(model, augmentation_multiplicity={declared}).")


def tag_dataset(dataset, tag):
    """Returns ``dataset`` tagged with ``tag`` (a SamplingTag)."""
    keras_bridge.set_untracked(dataset, _ATTRIBUTE, tag)
    return dataset


def sampling_of(dataset, _depth=0):
    """The SamplingTag of ``dataset`` or of the dataset it was made from, or None."""
    tag = vars(dataset).get(_ATTRIBUTE) if hasattr(dataset, "__dict__") else None
    if tag is not None or _depth > 64:
        return tag
    inputs = keras_bridge.dataset_inputs(dataset)
    if len(inputs) != 1:
        return None
    found = sampling_of(inputs[0], _depth + 1)
    if found is not None and keras_bridge.dataset_kind(dataset) in _KEEPS[found.kind]:
        return found
    return None


def made_from_poisson_batches(dataset, _depth=0):
    """Whether ``dataset`` is, or was made by any transformation from (its inputs, or a
    pipeline its function reads: a flat_map's), a dataset of poisson_batches (whose padded
    batches only their info dict tells from real rows).

    >>> ds = tf.data.Dataset.from_tensor_slices(np.arange(4.0))
    >>> made_from_poisson_batches(ds), made_from_poisson_batches(
    ...     tag_dataset(ds, SamplingTag("poisson", 4, 2)).cache().map(lambda v: v))
    (False, True)
    """
    tag = vars(dataset).get(_ATTRIBUTE) if hasattr(dataset, "__dict__") else None
    if tag is not None or _depth > 64:
        return tag is not None and tag.kind == "poisson"
    return any(made_from_poisson_batches(source, _depth + 1)
               for source in (keras_bridge.dataset_inputs(dataset)
                              + keras_bridge.captured_datasets(dataset)))


def shuffled_batches(x, y=None, sample_weight=None, *, batch_size, drop_remainder=False,
                     shuffle=True):
    """tf.data of batches that use each example once per pass, reshuffled every pass.

    The sampling that ε "without amplification" (``sampling="shuffle"``) is proven for,
    tagged so: training on it is accounted as such, without a warning. Structures
    (dicts, tuples) of arrays work as for ``fit``. The order comes from a secret key
    (it does not matter for this bound, but neither does it leak).
    """
    data = tuple(t for t in (x, y, sample_weight) if t is not None)
    num_examples = int(tf.nest.flatten(data)[0].shape[0])
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if shuffle:
        dataset = dataset.shuffle(num_examples, seed=randomness.secret_seed(),
                                  reshuffle_each_iteration=True)
    dataset = dataset.batch(int(batch_size), drop_remainder=drop_remainder)
    steps = num_examples // int(batch_size) + (0 if drop_remainder or
                                                not num_examples % int(batch_size) else 1)
    return tag_dataset(dataset.prefetch(tf.data.AUTOTUNE),
                       SamplingTag("shuffle", num_examples, batch_size, None, steps))
