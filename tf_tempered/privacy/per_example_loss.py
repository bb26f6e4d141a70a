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
"""The user's compiled loss as one loss per example: what DP-SGD clips.

Whatever the compile says — a string name (``"sparse_categorical_crossentropy"``), a
loss object with any reduction, a plain function, a dict or list of losses for several
outputs with ``loss_weights``, ``sample_weight`` — example i's loss is

    ℓ_i = Σ_k w_k · ρ_k(s_i · L_k(y_i, ŷ_i)),

where L_k is output k's loss evaluated without batch reduction (Keras' own call of the
loss object, reduction "none"), s_i the sample weight (times the mask of ŷ), w_k the
loss weight, and ρ_k reduces the example's remaining axes (time steps, pixels) by their
mean, or by their sum for a loss whose reduction is "sum". So the mean of ℓ_i over the
batch is the scalar Keras would train on: the reduction chooses the scale only, and
DP-SGD's own normaliser (microbatches, or the expected batch size) replaces the batch
mean. One exception, on purpose: Keras' "sum_over_batch_size" rescales a masked loss by
the batch's count of valid entries, a quantity of the whole batch; here a masked entry
counts as zero and ρ still divides by the example's number of entries, so no example's
loss depends on another's.

Refused with the fix: a loss function that reduces over the batch (it returns one
value for the whole batch, so no example has a loss of its own), and a model whose
``compute_loss`` override returns a scalar.

>>> from tf_tempered._compat import keras
>>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
>>> model.compile(loss="sparse_categorical_crossentropy")
>>> y_pred = tf.nn.softmax(tf.constant([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]]))
>>> losses, _ = per_example_losses(model, None, tf.constant([1, 2]), y_pred, None)
>>> np.round(losses.numpy(), 4)  # −log softmax of the label: −log 0.6285, −log 0.8962
array([0.4644, 0.1096], dtype=float32)
"""

import numpy as np  # noqa: F401  (used by the doctest)

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import custom_gradients
from tf_tempered.privacy.errors import ScalarLossError

__all__ = ["per_example_losses", "reduce_per_example"]


def reduce_per_example(values, how="mean", rows=None):
    """[rows, ...] → [rows]: the mean (or sum) over every axis but the first. A rank known
    only at run time (``tf.squeeze`` without an axis, on a batch whose length is not
    known: [rows], or a scalar for a batch of one) is read as [rows, -1], ``rows`` the
    batch's length.

    >>> reduce_per_example(tf.constant([[1.0, 3.0], [2.0, 2.0]])).numpy()
    array([2., 2.], dtype=float32)
    """
    if values.shape.rank is None and rows is not None:
        values = tf.reshape(values, tf.stack([rows, -1]))
    if values.shape.rank == 1:
        return values
    axes = list(range(1, values.shape.rank))
    return (tf.reduce_sum if how == "sum" else tf.reduce_mean)(values, axis=axes)


def _check_per_example(raw, y_pred, what, fix):
    """Raises ScalarLossError when ``raw`` has no batch axis matching ``y_pred``'s."""
    rows = tf.nest.flatten(y_pred)[0].shape[0] if y_pred is not None else None
    if raw.shape.rank == 0 or (raw.shape[0] is not None and rows is not None
                               and raw.shape[0] != rows):
        how = ("one value for the whole batch" if raw.shape.rank == 0 else
               f"{raw.shape[0]} rows, not one per example (each row would be clipped as an "
               "example)")
        raise ScalarLossError(
            f"{what} returns shape {raw.shape.as_list()} for a batch of {rows} examples: "
            f"{how}, so no example has a loss of its own and "
            f"DP-SGD cannot clip each example's gradient. Fix: {fix}")


_FUNCTION_FIX = ("return the loss of each example, reducing over the non-batch axes "
                 "only (e.g. tf.reduce_mean(..., axis=-1), not over the batch), or use a "
                 "Keras loss: any reduction works, the engine takes it per example.")


class _PerExample:
    """Stands in for one compiled loss object: returns its loss per row, [rows]."""

    reduction = "none"  # what Keras 2's loss container reads (no rescaling)

    def __init__(self, loss, seen):
        self.loss = loss
        self.name = getattr(loss, "name", "loss")
        self._seen = seen
        if keras_bridge.mixes_examples(loss):
            raise ValueError(
                f"The loss {self.name!r} compares the batch's examples with each other "
                "(Keras' Circle loss: pairwise similarities within the batch), so one "
                "example's loss depends on the others: clipping each example's gradient "
                "would not bound what one example changes, and DP-SGD's guarantee would not "
                "hold. Fix: a loss computed for each example on its own (e.g. a "
                "classification loss on the labels).")

    def __call__(self, y_true, y_pred, sample_weight=None):
        def check(raw):
            _check_per_example(raw, y_pred, f"The loss {self.name!r}",
                               keras_bridge.unreduced_axis_fix(self.loss) or _FUNCTION_FIX)
        values, raw = keras_bridge.loss_values(self.loss, y_true, y_pred, sample_weight,
                                               check)
        check(raw)
        how = "sum" if keras_bridge.reduction_of(self.loss) == "sum" else "mean"
        per_row = reduce_per_example(values, how, rows=tf.shape(tf.nest.flatten(y_pred)[0])[0])
        self._seen.append(per_row)
        return per_row


def per_example_losses(model, x, y, y_pred, sample_weight, *, container=None):
    """([rows] float32 losses, [each output's [rows] loss]) of the model's compiled loss.

    ``sample_weight``: Keras' (the user's weights times a Poisson mask), or None;
    ``container``: a loss container (keras_bridge.loss_container) to use instead.
    """
    if container is None and keras_bridge.overrides_compute_loss(model):
        losses = type(model).compute_loss(model, x, y, y_pred, sample_weight)
        _check_per_example(losses, y_pred, f"{type(model).__name__}.compute_loss",
                           _OVERRIDE_FIX)
        return _one_row_per_example(tf.cast(reduce_per_example(losses), tf.float32), y_pred,
                                    _OVERRIDE_FIX), []
    seen = []
    total = keras_bridge.compiled_loss_per_example(
        model, y, y_pred, sample_weight, lambda loss: _PerExample(loss, seen),
        container=container)
    return _one_row_per_example(tf.cast(total, tf.float32), y_pred, _FUNCTION_FIX), seen


_OVERRIDE_FIX = ("return one loss per example ([batch] or [batch, ...]); the DP engine "
                 "averages it over the non-batch axes and divides by its own normaliser.")


def _one_row_per_example(losses, y_pred, fix):
    """``losses`` checked, while the step runs, to hold one row per example of ``y_pred``
    (a batch size known only then: a per-token loss flattened to [B·T] would otherwise be
    clipped per token). Eagerly and in graphs an assertion naming the fix; under XLA, which
    drops assertions, the reshape to [B] fails instead."""
    if y_pred is None or not tf.nest.flatten(y_pred):
        return losses
    first = tf.nest.flatten(y_pred)[0]
    if not isinstance(first, tf.Tensor) or first.shape.rank in (None, 0):
        return losses
    rows = tf.shape(first)[0]
    check = tf.debugging.assert_equal(
        tf.shape(losses)[0], rows, message=(
            "The per-example losses have another number of rows than the batch has examples "
            "(a loss flattened over time steps or tokens, or masked by tf.boolean_mask?): "
            "DP-SGD would clip each row as an example. Fix: " + fix))
    @tf.custom_gradient
    def checked(values):
        def gradient(upstream):  # the update's path: the step fails before any update
            with tf.control_dependencies([check]):
                return tf.identity(upstream)
        return tf.identity(values), gradient

    with tf.control_dependencies([check]), tf.name_scope(custom_gradients.ENGINE_SCOPE):
        return tf.reshape(checked(losses), [rows])
