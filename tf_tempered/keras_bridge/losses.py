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
"""Keras internals about losses: the user's compiled loss, evaluated per example.

Keras reduces the compiled loss over the batch (a string name, a loss object with any
reduction, a function, a dict or list for several outputs with ``loss_weights``). DP-SGD
needs one loss per example, so :func:`compiled_loss_per_example` calls the model's own
compiled loss container (Keras' structure matching of labels, outputs, sample weights
and loss weights, unchanged) with each of its loss objects replaced, for that call
only, by a stand-in that returns its loss per row (:func:`loss_values`, reduction
"none"). Its per-output loss trackers are left out of that call; the engine updates
them with the masked means itself.
"""

import contextlib

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.keras_bridge.training import overriding_class

__all__ = ["compiled_loss_per_example", "compiled_loss_trackers", "loss_container",
           "loss_values", "overrides_compute_loss", "reduction_of", "mixes_examples",
           "unreduced_axis_fix", "weigh_rows"]

IS_KERAS3 = KERAS_MAJOR == 3


class _NoMetric:
    """Stands in for a loss tracker during the per-example call (its update is the engine's)."""

    name = "unused"

    def update_state(self, *args, **kwargs):
        del args, kwargs


def reduction_of(loss):
    """The reduction string of a Keras loss object ("sum", "none", "sum_over_batch_size", ...)."""
    return str(getattr(loss, "reduction", "sum_over_batch_size") or "none").lower()


def mixes_examples(loss):
    """True for a Keras loss whose value for one example depends on the batch's other
    examples: Keras 3's ``circle`` (``Circle``), built from the pairwise similarities of
    the batch's embeddings."""
    circle = getattr(keras.losses, "circle", None) if IS_KERAS3 else None
    return circle is not None and getattr(loss, "fn", None) is circle


# Keras 3's loss functions whose ``axis`` of None reduces over every axis, the batch's too
# (what ``loss="dice"`` compiles), and the class that takes the axes.
_WHOLE_BATCH_FUNCTIONS = {"dice": "Dice", "tversky": "Tversky"}


def unreduced_axis_fix(loss):
    """The fix for a Keras loss with an ``axis`` of None, which reduces over every axis
    (Keras 3's Dice, Tversky, also as the strings ``"dice"``, ``"tversky"``): its class with
    ``axis`` the non-batch axes; else None."""
    kwargs = getattr(loss, "_fn_kwargs", None)
    if not IS_KERAS3 or not isinstance(kwargs, dict) or kwargs.get("axis") is not None:
        return None
    function = getattr(getattr(loss, "fn", None), "__name__", None)
    if "axis" in kwargs:
        name, how = type(loss).__name__, ""
    elif function in _WHOLE_BATCH_FUNCTIONS:
        name = _WHOLE_BATCH_FUNCTIONS[function]
        how = f" instead of the string {function!r}"
    else:
        return None
    return (f"keras.losses.{name}(axis=...) with the non-batch axes{how} (e.g. "
            f"{name}(axis=(1, 2, 3)) for images [B, H, W, C]), which gives one loss per "
            f"example.")


def loss_values(loss, y_true, y_pred, sample_weight, check=None):
    """(weighted values [rows, ...], raw values of ``loss.call``) of one Keras loss object;
    ``check(raw)``, if given, runs on the raw values before any weight is applied (a loss
    whose rows are not the batch's fails it, not the weighing).

    The loss is called as Keras calls it (dtype conversion, the mask of ``y_pred``,
    ``sample_weight``) with its reduction set to "none" for this call: no batch
    reduction, and no rescaling of a mask by the batch's count of valid entries (a
    quantity of the whole batch). The raw values (what the loss's own ``call``
    returned) tell a function that reduces over the batch by its rank.

    A weight of one value per row ([rows], e.g. a Poisson batch's mask) weighs every
    entry of its row's values ([rows, T] for per-timestep labels): Keras 2 broadcasts it
    so, Keras 3's ``Loss.__call__`` fails on it; here the stand-in ``call`` applies the
    weight (:func:`weigh_rows`) and Keras gets none, whenever the loss class keeps
    Keras' own ``__call__``.
    """
    seen = []
    had_call = "call" in vars(loss)
    original_call = _per_example_hinge(loss) or loss.call
    weigh_in_call = sample_weight is not None and _keras_call_of(loss)

    def call(*args, **kwargs):
        out = original_call(*args, **kwargs)
        seen.append(out)
        if check is not None:
            check(out)
        return weigh_rows(out, sample_weight) if weigh_in_call else out

    reduction = loss.reduction
    object.__setattr__(loss, "call", call)
    object.__setattr__(loss, "reduction", "none")
    try:
        values = loss(y_true, y_pred, sample_weight=None if weigh_in_call else sample_weight)
    finally:
        object.__setattr__(loss, "reduction", reduction)
        if had_call:
            object.__setattr__(loss, "call", original_call)
        else:
            object.__delattr__(loss, "call")
    return values, (seen[-1] if seen else values)


def _per_example_hinge(loss):
    """Keras' ``hinge``/``squared_hinge`` (strings, classes, functions) as a call whose
    labels are converted per example, or None for another loss.

    Keras turns {0, 1} labels into {-1, 1} when every label of the batch is 0 or 1 (a
    ``tf.cond`` on all of them: one example's labels decide another's loss, which the DP
    step refuses). Converting each example's own labels the same way gives Keras' values
    whenever the labels are {0, 1} or {-1, 1}:

        ℓ_i = mean_j max(1 − y'_ij · ŷ_ij, 0) (squared for squared_hinge),
        y'_i = 2 y_i − 1 if every y_ij is 0 or 1, else y_i.
    """
    fn = getattr(loss, "fn", None)
    squared = {keras.losses.hinge: False, keras.losses.squared_hinge: True}.get(fn)
    if squared is None:
        return None

    def call(y_true, y_pred):
        y_pred = tf.convert_to_tensor(y_pred)
        y_true = tf.cast(y_true, y_pred.dtype)
        if y_true.shape.rank is not None and y_true.shape.rank == y_pred.shape.rank - 1:
            y_true = tf.expand_dims(y_true, -1)  # labels [B] for outputs [B, 1], as Keras does
        binary = tf.logical_or(tf.equal(y_true, 0.0), tf.equal(y_true, 1.0))
        axes = list(range(1, y_true.shape.rank or 1))
        each = tf.reduce_all(binary, axis=axes, keepdims=True) if axes else binary
        y_true = tf.where(each, 2.0 * y_true - 1.0, y_true)
        margin = tf.maximum(1.0 - y_true * y_pred, 0.0)
        return tf.reduce_mean(tf.square(margin) if squared else margin, axis=-1)
    return call


def _keras_call_of(loss):
    """True when ``loss`` is a Keras Loss whose class keeps Keras' own ``__call__``."""
    return isinstance(loss, keras.losses.Loss) and \
        type(loss).__call__ is keras.losses.Loss.__call__


def weigh_rows(values, weight):
    """``values · weight`` as Keras weighs a loss, a row weight broadcast over each row.

    A weight with a trailing axis of 1 more than the values loses it; a weight of lower
    rank gets trailing axes of 1, so [rows] weighs every entry of [rows, T] (Keras 2's
    broadcast; Keras 3 refuses it). Keeps the values' Keras mask.

    >>> weigh_rows(tf.ones([2, 3]), tf.constant([1.0, 0.0])).numpy()
    array([[1., 1., 1.],
           [0., 0., 0.]], dtype=float32)
    """
    values = tf.convert_to_tensor(values)
    weight = tf.cast(weight, values.dtype)
    rank = values.shape.rank
    if rank is not None and weight.shape.rank is not None:
        if weight.shape.rank == rank + 1 and weight.shape[-1] == 1:
            weight = tf.squeeze(weight, -1)
        weight = tf.reshape(weight, tf.concat(
            [tf.shape(weight), tf.ones([max(rank - weight.shape.rank, 0)], tf.int32)], 0))
    weighted = values * weight
    mask = getattr(values, "_keras_mask", None)
    if mask is not None:
        weighted._keras_mask = mask  # pylint: disable=protected-access
    return weighted


@contextlib.contextmanager
def _stand_ins(container, per_example):
    """The container's loss objects replaced by ``per_example(loss)`` and its loss trackers
    by no-ops, inside the block; restored after."""
    if IS_KERAS3:
        names = ("_flat_losses", "_metrics")

        def swap():
            container._flat_losses = [  # pylint: disable=protected-access
                entry._replace(loss=per_example(entry.loss)) if entry.loss is not None
                else entry for entry in container._flat_losses]  # pylint: disable=protected-access
            container._metrics = [_NoMetric() for _ in container._metrics]  # pylint: disable=protected-access
    else:
        names = ("_losses", "_per_output_metrics", "_total_loss_mean")

        def swap():
            container._losses = [per_example(loss) if loss is not None else None  # pylint: disable=protected-access
                                 for loss in container._losses]  # pylint: disable=protected-access
            container._per_output_metrics = [  # pylint: disable=protected-access
                None for _ in container._per_output_metrics]  # pylint: disable=protected-access
            container._total_loss_mean = _NoMetric()  # pylint: disable=protected-access

    built = container.built
    saved = {}
    original_build = container.build

    def build(*args, **kwargs):
        original_build(*args, **kwargs)
        saved.update({name: getattr(container, name) for name in names})
        swap()

    if built:
        saved.update({name: getattr(container, name) for name in names})
        swap()
    else:  # Keras builds it inside the call, from the labels and outputs it sees
        object.__setattr__(container, "build", build)
    try:
        yield
    finally:
        if not built:
            object.__delattr__(container, "build")
        for name, value in saved.items():
            object.__setattr__(container, name, value)


def _container(model):
    container = model._compile_loss if IS_KERAS3 else model.compiled_loss  # pylint: disable=protected-access
    # tf-keras keeps a container of no losses for compile(loss=None): it returns None.
    if container is None or not IS_KERAS3 and getattr(container, "_user_losses", 0) is None:
        raise ValueError(
            "The model was compiled without a loss. Fix: compile with one, e.g. "
            "model.compile(optimizer=..., loss=\"sparse_categorical_crossentropy\").")
    return container


def compiled_loss_per_example(model, y, y_pred, sample_weight, per_example, container=None):
    """The model's compiled loss (or ``container``'s) with each loss object replaced by
    ``per_example(loss)``.

    ``per_example(loss)`` returns a callable ``(y_true, y_pred, sample_weight) → [rows]``;
    the container applies the ``loss_weights`` and sums the outputs' per-row losses.
    """
    container = _container(model) if container is None else container
    with _stand_ins(container, per_example):
        return container(y, y_pred, sample_weight)


def compiled_loss_trackers(model):
    """The per-output loss trackers of a multi-output model, one per loss the container
    calls (in its order; None where Keras keeps none), else [] (also for a model compiled
    without a loss whose compute_loss override gives the loss: no container; probe R)."""
    try:
        container = _container(model)
    except ValueError:
        if overrides_compute_loss(model):
            return []
        raise
    if IS_KERAS3:
        trackers = list(container.metrics)
        flat = container._flat_losses or []  # pylint: disable=protected-access
        return trackers if len(trackers) == len(flat) else []
    per_output = container._per_output_metrics or []  # pylint: disable=protected-access
    losses = container._losses if container.built else []  # pylint: disable=protected-access
    trackers = [m for loss, m in zip(losses, per_output) if loss is not None]
    return trackers if any(m is not None for m in trackers) else []


def overrides_compute_loss(model):
    """Whether the model's class overrides Keras' ``compute_loss`` (a custom loss)."""
    return overriding_class(model, "compute_loss") is not None


def loss_container(model, loss, loss_weights=None):
    """Keras' container of ``loss`` as ``model.compile(loss=..., loss_weights=...)`` would
    build it (the structure matching of outputs and labels), for DPGradients."""
    if IS_KERAS3:
        from keras.src.trainers.compile_utils import CompileLoss  # pylint: disable=g-import-not-at-top
        names = getattr(model, "output_names", None)
        return CompileLoss(loss, loss_weights, output_names=names)
    from tf_keras.src.engine.compile_utils import LossesContainer  # pylint: disable=g-import-not-at-top
    return LossesContainer(loss, loss_weights, output_names=getattr(model, "output_names", None))
