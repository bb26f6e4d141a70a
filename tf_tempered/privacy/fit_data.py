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
"""The batches of a private model's ``fit``, and what the accountant is told about them.

* In-memory data (NumPy arrays, tensors, pandas, dicts/lists/tuples of them): Poisson
  batches by default (``make_private(..., sampling="poisson")``), drawn by
  :func:`~tf_tempered.privacy.poisson_batches` with expected size ``batch_size``:
  fresh secret membership every step, accounted with the amplified ε. With
  ``sampling="shuffle"`` Keras' own shuffled batches (each example once per epoch),
  accounted with the bound without amplification. ``validation_split``,
  ``class_weight`` and ``sample_weight`` keep their Keras meaning.
* A tf.data pipeline: as its tag says (:mod:`tf_tempered.privacy.data_sampling`):
  Poisson for ``poisson_batches`` (and ``augmult_batches`` of it), shuffled for
  ``shuffled_batches``; any other pipeline (or a generator, a PyDataset) is accounted
  with the bound for shuffled batches, assuming each example appears at most once per
  epoch, and a warning (once per model) names ``poisson_batches``.
"""

import math
import numbers
import warnings

import numpy as np

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import (class_weights, data_sampling, fit_data_checks,
                                  pipeline_accounting, sampling, user_frame)
from tf_tempered.privacy.run_sampling import RunSampling

__all__ = ["RunSampling", "batch_spec", "plan_fit_data", "rows_batched"]


def _is_array(value):
    return isinstance(value, (np.ndarray, tf.Tensor)) or hasattr(value, "to_numpy")


def _in_memory(x):
    leaves = tf.nest.flatten(x)
    return bool(leaves) and all(_is_array(leaf) for leaf in leaves) and not isinstance(
        x, tf.data.Dataset)


def batch_spec(arguments):
    """The TypeSpecs of one batch of fit's (planned) data, ``(x, y[, ...])``, or None
    (a generator or PyDataset: not known before fit reads it).

    >>> spec = batch_spec({"x": np.zeros([6, 3], np.float32), "y": np.zeros([6], np.int64)})
    >>> spec[0].shape.as_list(), spec[1].shape.as_list(), spec[1].dtype.name
    ([None, 3], [None], 'int64')
    """
    x, y = arguments.get("x"), arguments.get("y")
    if isinstance(x, tf.data.Dataset):
        return x.element_spec
    if not _in_memory(x) or y is None or not _in_memory(y):
        return None
    as_spec = lambda a: tf.TensorSpec([None, *np.shape(a)[1:]],  # noqa: E731
                                      tf.as_dtype(getattr(a, "dtype", np.float32)))
    return tf.nest.map_structure(as_spec, (_tuples(x), _tuples(y)))


def _tuples(value):
    """``value`` with its lists as tuples: tf.data stacks a list, and keeps a tuple."""
    if isinstance(value, (list, tuple)):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def _as_arrays(value):
    """``value`` with pandas objects as NumPy arrays and lists as tuples (several inputs)."""
    if value is None:
        return None
    return tf.nest.map_structure(
        lambda t: t.to_numpy() if hasattr(t, "to_numpy") and not isinstance(t, tf.Tensor)
        else t, _tuples(value))


def _rows(value):
    return int(tf.nest.flatten(value)[0].shape[0])


def _split(value, start, stop):
    return None if value is None else tf.nest.map_structure(lambda t: t[start:stop], value)


def _checked_weights(weights):
    if weights is not None:
        for leaf in tf.nest.flatten(weights):
            if not np.all(np.asarray(leaf) >= 0):  # (NaN too)
                raise ValueError(
                    "sample_weight (or class_weight) has a negative or NaN entry: DP-SGD "
                    "weighs each example's loss before clipping, and such a weight is "
                    "refused. Fix: pass finite weights >= 0.")
    return weights


def _prepared_arrays(arguments):
    """(x, y, sample_weight with class weights, validation data) as Keras would split them."""
    x, y, weights = (_as_arrays(arguments.get(k)) for k in ("x", "y", "sample_weight"))
    class_weight = arguments.get("class_weight")
    if class_weight:
        per_class = class_weights.per_example(y, class_weight)
        weights = per_class if weights is None else tf.nest.map_structure(
            lambda w: np.asarray(w, np.float32) * per_class, weights)
    _checked_weights(weights)
    validation = arguments.get("validation_data")
    split = arguments.get("validation_split") or 0.0
    if split and validation is None:
        if not 0 < split < 1:
            raise ValueError(f"validation_split must be in [0, 1), got {split!r}.")
        rows = _rows(x)
        at = int(math.floor(rows * (1.0 - split)))  # Keras' split: the last rows
        validation = tuple(t for t in (_split(x, at, rows), _split(y, at, rows),
                                       _split(weights, at, rows)) if t is not None)
        x, y, weights = _split(x, 0, at), _split(y, 0, at), _split(weights, 0, at)
    return x, y, weights, validation


def _as_dataset_arguments(arguments, dataset, validation, batch_size, steps_per_epoch=None):
    """``fit``'s arguments with the data replaced by ``dataset`` (validation kept)."""
    # shuffle: the dataset is drawn as it must be (Keras ignores it for datasets, and
    # Keras 3 warns when it is True).
    new = dict(arguments, x=dataset, y=None, sample_weight=None, class_weight=None,
               batch_size=None, validation_split=0.0, validation_data=validation,
               steps_per_epoch=steps_per_epoch, shuffle=False)
    if validation is not None and "validation_batch_size" in new:
        new["validation_batch_size"] = arguments.get("validation_batch_size") or batch_size
    return new


def _batch_size(arguments, rows):
    batch = arguments.get("batch_size") or 32  # Keras' default for arrays
    if isinstance(batch, bool) or not isinstance(batch, numbers.Integral) or batch <= 0:
        raise ValueError(f"batch_size must be a positive integer, got {batch!r}.")
    return min(int(batch), rows)


def _poisson(model, state, config, arguments):
    if config.num_microbatches is not None:
        raise ValueError(
            f"num_microbatches={config.num_microbatches}: microbatches need batches of a "
            "fixed size, and Poisson batches (what fit draws from arrays by default) vary in "
            "size. Fix: num_microbatches=None (per-example clipping, the amplified Poisson ε), "
            "or make_private(model, ..., sampling=\"shuffle\") for fixed-size shuffled "
            "batches (ε without amplification).")
    x, y, weights, validation = _prepared_arrays(arguments)
    if y is None:
        raise ValueError(
            "fit on arrays without y: Poisson batches carry the labels with the examples. "
            "Fix: pass y (e.g. the inputs themselves for an autoencoder), or fit on a tf.data "
            "pipeline (tf_tempered.privacy.poisson_batches for the amplified ε).")
    rows = _rows(x)
    batch = _batch_size(arguments, rows)
    fit_data_checks.warn_if_order_asked(state, arguments.get("shuffle", True))
    steps = arguments.get("steps_per_epoch") or sampling.poisson_steps_per_epoch(
        num_examples=rows, expected_batch_size=batch)
    epochs = max(1, int(arguments.get("epochs") or 1) - int(arguments.get("initial_epoch") or 0))
    q = batch / rows
    seed = state.noise.insecure_dp_seed
    if model.distribute_strategy.num_replicas_in_sync > 1:
        if keras_bridge.IS_KERAS3:
            raise ValueError(
                "fit on arrays under a tf.distribute strategy with several replicas: Poisson "
                "batches must be drawn per replica, which Keras 3's fit on arrays cannot do. "
                "Fix: fit on data = tf_tempered.privacy.distributed_poisson_batches(strategy, "
                "x, y, expected_batch_size=..., steps=steps) with steps_per_epoch=steps "
                "(docs/distributed.md), or use Keras 2 (TF_USE_LEGACY_KERAS=1), or "
                "make_private(..., sampling=\"shuffle\").")
        dataset = sampling.distributed_poisson_batches(
            model.distribute_strategy, x, y, sample_weight=weights, expected_batch_size=batch,
            steps=steps, insecure_dp_seed=seed)
        new = _as_dataset_arguments(arguments, dataset, validation, batch, steps)
    else:
        max_batch = sampling.default_max_batch_size(
            num_examples=rows, sampling_probability=q, total_steps=steps * epochs)
        dataset = sampling.poisson_batches(x, y, sample_weight=weights,
                                           expected_batch_size=batch, steps=steps,
                                           max_batch_size=max_batch, insecure_dp_seed=seed)
        new = _as_dataset_arguments(arguments, dataset, validation, batch)
    return new, RunSampling("poisson", rows, float(batch), q)


def _shuffle(config, arguments):
    x, y, weights, validation = _prepared_arrays(arguments)
    rows = _rows(x)
    batch = _batch_size(arguments, rows)
    multi = config.num_microbatches is not None and batch > config.num_microbatches
    if config.num_microbatches is not None and rows % batch % config.num_microbatches:
        # Keras' last batch would be short and not split into num_microbatches equal
        # microbatches: drop it (a different random remainder each epoch; each example
        # still once at most).
        dataset = data_sampling.shuffled_batches(
            x, y, weights, batch_size=batch, drop_remainder=True,
            shuffle=arguments.get("shuffle") is not False)
        run = RunSampling("shuffle", rows, float(batch), None, multi, rows // batch)
        return _as_dataset_arguments(arguments, dataset, validation, batch), run
    return dict(arguments), RunSampling("shuffle", rows, float(batch), None, multi,
                                        -(-rows // batch))


def _pipeline(state, config, arguments, tag):
    """fit on a pipeline: its batches as they are, accounted by ``tag`` (its SamplingTag)."""
    x = keras_bridge.source_dataset(arguments.get("x"))
    if isinstance(x, tf.data.Dataset):
        arguments = dict(arguments, shuffle=False)  # Keras ignores it for a dataset (and
        # Keras 3 warns when it is True, its default)
    if tag is not None and tag.kind == "poisson":
        if config.num_microbatches is not None:
            raise ValueError(
                f"num_microbatches={config.num_microbatches} with Poisson batches: "
                "microbatches need batches of a fixed size. Fix: num_microbatches=None "
                "(per-example clipping).")
        return arguments, RunSampling("poisson", tag.num_examples, tag.batch_size,
                                      tag.sampling_probability)
    batching = keras_bridge.batching_of(x)
    if config.num_microbatches is not None and batching is not None:
        size, drop, rows = batching
        if not drop and rows is not None and rows % size:
            raise ValueError(
                f"num_microbatches={config.num_microbatches}: the dataset's last batch holds "
                f"{rows % size} of its {rows} examples, not {size}, and cannot be split into "
                f"{config.num_microbatches} equal microbatches. Fix: "
                f".batch({size}, drop_remainder=True), or num_microbatches=None.")
    batch = tag.batch_size if tag is not None else (batching[0] if batching else None)
    multi = config.num_microbatches is not None and (batch is None
                                                     or batch > config.num_microbatches)
    if (tag is None and "unknown pipeline" not in state.warned
            and not class_weights.is_poisson_pipeline(x)):  # its own warning, below
        state.warned.add("unknown pipeline")
        sparse = isinstance(x, tf.SparseTensor) or hasattr(x, "tocsr")  # (scipy's)
        warnings.warn((pipeline_accounting.SPARSE_ARRAYS_WARNING if sparse else
                       pipeline_accounting.UNKNOWN_PIPELINE_WARNING).format(
            what=type(x).__name__) + pipeline_accounting.assumed_epoch_note(
                x, arguments.get("steps_per_epoch")), UserWarning,
            stacklevel=user_frame.user_stacklevel())
    passes, weight = ((tag.steps_per_pass, 1) if tag
                      else pipeline_accounting.untagged_passes(state.warned, x))
    return arguments, RunSampling("shuffle", tag.num_examples if tag else None, batch,
                                  None, multi, passes, weight, _persistent_iterator(arguments))


def _persistent_iterator(arguments):
    """Whether one iterator of fit's data serves every epoch (both Kerases keep it for an
    endless pipeline fit by steps_per_epoch; an iterator cannot be started again)."""
    x = arguments.get("x")
    if isinstance(x, tf.data.Iterator):
        return True
    # Wrapped by experimental_distribute_dataset, its iterator is kept alike (probe E3, S1).
    dataset = keras_bridge.source_dataset(x)
    return (bool(arguments.get("steps_per_epoch")) and isinstance(dataset, tf.data.Dataset)
            and int(dataset.cardinality()) == int(tf.data.INFINITE_CARDINALITY))


def rows_batched(arguments):
    """The rows under the batching of fit's tf.data pipeline, when read (for the δ check of a
    pipeline whose number of examples nothing declared: δ ≥ 1/N was not warned; probe T,
    F2), or None."""
    batching = keras_bridge.batching_of(keras_bridge.source_dataset(arguments.get("x")))
    return batching[2] if batching else None


def plan_fit_data(model, state, config, arguments):
    """(fit's arguments with the data as the engine draws it, the RunSampling)."""
    x = arguments.get("x")
    if _in_memory(x):
        if state.augmentation_multiplicity > 1:
            raise ValueError(
                f"augmentation_multiplicity={state.augmentation_multiplicity} needs batches "
                "that hold each example's augmented copies. Fix: fit on "
                "tf_tempered.augment.augmult_batches(tf_tempered.privacy.poisson_batches("
                "x, y, ...), multiplicity=...).")
        if state.sampling == "poisson":
            return _poisson(model, state, config, arguments)
        return _shuffle(config, arguments)
    fit_data_checks.refuse_poisson_batches_without_info(x)
    if arguments.get("class_weight"):
        _checked_weights(np.array(list(arguments["class_weight"].values()), np.float32))
        if class_weights.is_poisson_pipeline(x):  # Keras would take its info dict for weights
            x = class_weights.into_poisson_info(x, arguments["class_weight"])
            arguments = dict(arguments, x=x, class_weight=None)
    source = keras_bridge.source_dataset(x)
    data_sampling.refuse_mismatched_copies(state.augmentation_multiplicity, source)
    tag = data_sampling.sampling_of(source) if hasattr(source, "__dict__") else None
    fit_data_checks.refuse_poisson_batches_of_one_device(model, x, tag)
    fit_data_checks.warn_if_xla_meets_varying_batches(model, state, tag)
    return _pipeline(state, config, arguments, tag)
