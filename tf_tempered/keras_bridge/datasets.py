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
"""tf.data internals: a dataset's transformation, its inputs, its batching, and the one
vocabulary of transformations by what they keep of the batches and passes below them.

tf.data has no public way to read a pipeline; these read its private class names and
``_inputs()``. A TF release that renames them makes pipelines unreadable, which the
accounting treats as its most cautious case (every step a pass, or refused), except the
plain one-pass-per-epoch form, which is read as such only when no repeat is seen.
"""

from tf_tempered._compat import tf

__all__ = ["BATCH", "GROUPING", "ONE_TO_ONE", "OVERLAPPING", "batching_of", "captured_datasets",
           "dataset_inputs", "dataset_kind", "source_dataset"]

# One output per input element, in order (the count of a pass's examples is kept).
ONE_TO_ONE = frozenset({"MapDataset", "ParallelMapDataset", "PrefetchDataset",
                        "OptionsDataset", "CacheDataset", "AssertCardinalityDataset"})
# Batch ops whose size is read; every op that groups elements into batches.
BATCH = frozenset({"BatchDataset", "ParallelBatchDataset"})
GROUPING = BATCH | {"PaddedBatchDataset", "GroupByWindowDataset", "WindowDataset",
                    "RebatchDataset"}
# Elements that several outputs may hold: a window of shift < size.
OVERLAPPING = frozenset({"WindowDataset"})

# Above its .batch(), what keeps a pipeline's steps those batches, each once a pass: one
# output per input, and repeats. A take, skip, shard or filter of the batches does not
# (ds.batch(50).take(3).repeat() reuses 3 batches, not a pass of them); nor does a shuffle
# above a repeat (a batch may come back before the others came once).
_KEEPS_BATCHES = ONE_TO_ONE | {"RepeatDataset", "ShuffleDataset"}


def dataset_kind(dataset):
    """The tf.data class of a dataset, without tf.data's leading underscore ("MapDataset")."""
    return type(dataset).__name__.lstrip("_")


def dataset_inputs(dataset):
    """The datasets ``dataset`` was made from (tf.data's private ``_inputs``), [] if none."""
    try:
        return list(dataset._inputs())  # pylint: disable=protected-access
    except (AttributeError, NotImplementedError, TypeError):
        return []


def captured_datasets(dataset):
    """The pipelines a transformation's function reads whole (``flat_map(lambda _: other)``,
    an interleave of several): the tf.data datasets its Python function refers to (closure,
    globals, defaults, and lists, tuples or dicts of them) whose variant tensor the traced
    function captured; [] where there are none or they cannot be read.

    ``_inputs()`` names only the transformation's input (``range(1)`` here), so a pipeline
    made from poisson_batches inside a flat_map, its info dict dropped there, trained its
    padding rows as examples (probe S, F7).

    >>> inner = tf.data.Dataset.range(3)
    >>> captured_datasets(tf.data.Dataset.range(1).flat_map(lambda _: inner)) == [inner]
    True
    """
    found = []
    for wrapper in vars(dataset).values() if hasattr(dataset, "__dict__") else ():
        function = getattr(wrapper, "_func", None)
        try:
            captured = {id(t) for t in wrapper.function.captured_inputs}
        except (AttributeError, TypeError, ValueError):
            continue
        for candidate in _referred_objects(function):
            if (isinstance(candidate, tf.data.Dataset) and candidate not in found
                    and id(getattr(candidate, "_variant_tensor", None)) in captured):
                found.append(candidate)
    return found


def _referred_objects(function, _depth=0):
    """The objects a Python function refers to by its closure, globals and defaults (lists,
    tuples and dict values among them opened one level), through ``__wrapped__``."""
    if _depth > 8 or not callable(function):
        return []
    code = getattr(function, "__code__", None)
    globals_ = getattr(function, "__globals__", {})
    objects = [cell.cell_contents for cell in getattr(function, "__closure__", None) or ()
               if _filled(cell)]
    objects += [globals_[name] for name in getattr(code, "co_names", ()) if name in globals_]
    objects += list(getattr(function, "__defaults__", None) or ())
    objects += [item for obj in list(objects) if isinstance(obj, (list, tuple, dict))
                for item in (obj.values() if isinstance(obj, dict) else obj)]
    wrapped = getattr(function, "__wrapped__", None)
    return objects + (_referred_objects(wrapped, _depth + 1) if wrapped is not None else [])


def _filled(cell):
    try:
        cell.cell_contents  # pylint: disable=pointless-statement
    except ValueError:  # an empty cell
        return False
    return True


def batching_of(dataset, _depth=0, _shuffled=False):
    """(batch size, drop_remainder, rows batched) of the nearest ``.batch()`` in a tf.data
    pipeline of single-input steps that keep its batches, or None where it cannot be read
    (rows: None if the input's length is unknown).

    >>> ds = tf.data.Dataset.range(10)
    >>> batching_of(ds.batch(4).prefetch(1)), batching_of(ds.batch(4).take(2))
    ((4, False, 10), None)
    """
    if _depth > 64 or not isinstance(dataset, tf.data.Dataset):
        return None
    kind = dataset_kind(dataset)
    if kind in BATCH:
        try:
            batch_size = int(dataset._batch_size)  # pylint: disable=protected-access
            drop = bool(dataset._drop_remainder)  # pylint: disable=protected-access
            rows = int(dataset._input_dataset.cardinality())  # pylint: disable=protected-access
        except (AttributeError, TypeError, ValueError):
            return None
        return batch_size, drop, rows if rows >= 0 else None
    if kind not in _KEEPS_BATCHES or kind == "RepeatDataset" and _shuffled:
        return None
    inputs = dataset_inputs(dataset)
    return (batching_of(inputs[0], _depth + 1, _shuffled or kind == "ShuffleDataset")
            if len(inputs) == 1 else None)


def source_dataset(x):
    """The tf.data pipeline a tf.data iterator ``x`` reads (its private ``_dataset``; tf-keras
    fits on ``iter(dataset)``) or a tf.distribute DistributedDataset wraps
    (``strategy.experimental_distribute_dataset``: its private ``_original_dataset``), to
    be planned and accounted as that pipeline; ``x`` itself for anything else.

    Read as a source nothing could read, ``iter(ds.batch(16).repeat())`` counted one pass an
    epoch for 2 (probe U), and a wrapped pipeline that fit refuses trained (probe B2)."""
    if isinstance(x, tf.data.Iterator):
        dataset = getattr(x, "_dataset", None)
    elif isinstance(x, tf.distribute.DistributedDataset):
        dataset = getattr(x, "_original_dataset", None)
    else:
        dataset = None
    return dataset if isinstance(dataset, tf.data.Dataset) else x
