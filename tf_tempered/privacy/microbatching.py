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
"""How the rows of a batch form the microbatches that DP-SGD clips.

A batch of R rows is split into M microbatches of R/M consecutive rows; each
microbatch's loss is the mean of its rows' losses, and its gradient is clipped
to C as one unit. Three layouts:

* ``num_microbatches=None``, multiplicity 1: one row per microbatch (per-example
  clipping, the only layout Poisson batches allow);
* ``num_microbatches=M``: M microbatches of R/M examples (TF Privacy's
  microbatching; the sensitivity is C per microbatch, so one example changes
  the sum by at most C but ε must be accounted per microbatch);
* ``augmentation_multiplicity=K`` (De et al. 2022, "augmentation multiplicity"):
  the batch holds K consecutive augmented copies of each example, rows
  ``i·K … i·K+K−1`` for example i, and a microbatch is one example's K copies, so
  the clipped gradient of example i is clip_C((1/K) Σ_k ∇ℓ(aug_k(x_i))). One
  example still changes one clipped term: the sensitivity, the normaliser (the
  number of examples) and the ε are those of per-example clipping.

>>> microbatch_layout(tf.zeros([12]), num_microbatches=None, multiplicity=3, poisson=True)[:2]
(4, 3)
"""

from tf_tempered._compat import tf

__all__ = ["inputs_checked", "validate_multiplicity", "microbatch_layout", "microbatch_mask"]

def validate_multiplicity(value):
    """``value`` as an int >= 1; ValueError naming ``augmentation_multiplicity`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"augmentation_multiplicity={value!r} is invalid: it must be an int >= 1, the "
            "number of consecutive augmented copies of each example in a batch (1: no "
            "augmentation multiplicity). Fix: e.g. augmentation_multiplicity=4 with "
            "tf_tempered.augment.augmult_batches(..., multiplicity=4).")
    return value


def inputs_checked(x, *, num_microbatches, multiplicity=1):
    """``x`` (the batch's inputs) with the check that M·K divides its rows before them, when
    the rows are known only at run time: every reshape into microbatches (the layers'
    recorded inputs too, not only the losses) then runs after it, so a short batch gets the
    message naming the fix, not a bare reshape error."""
    per = (num_microbatches or 1) * multiplicity
    first = next((t for t in tf.nest.flatten(x) if isinstance(t, tf.Tensor)), None)
    if per == 1 or first is None or first.shape.rank in (None, 0) or first.shape[0] is not None:
        return x
    check = tf.debugging.assert_equal(
        tf.shape(first)[0] % per, 0, message=(
            _microbatch_message("a short", num_microbatches, multiplicity) if num_microbatches
            else _multiplicity_message("this", multiplicity)))
    with tf.control_dependencies([check]):
        return tf.nest.map_structure(
            lambda t: tf.identity(t) if isinstance(t, tf.Tensor) else t, x)


def microbatch_layout(losses, *, num_microbatches, multiplicity=1, poisson):
    """(number of microbatches M, rows per microbatch or None if not static).

    ``losses`` holds one loss per row; ``num_microbatches`` is None (one example
    per microbatch) or this replica's M.
    """
    static_rows = losses.shape[0]
    rows = static_rows if static_rows is not None else tf.shape(losses)[0]
    k = multiplicity
    if num_microbatches is None:
        if k == 1:
            return rows, 1, losses
        if static_rows is not None:
            if static_rows % k:
                raise ValueError(_multiplicity_message(static_rows, k))
            return static_rows // k, k, losses
        with tf.control_dependencies([tf.debugging.assert_equal(
                rows % k, 0, message=_multiplicity_message("this", k))]):
            return tf.identity(rows // k), k, tf.identity(losses)
    if poisson:
        raise ValueError(
            "Poisson-sampled batches need one example per microbatch: create the "
            "DP optimizer with num_microbatches=None.")
    per = num_microbatches * k  # every microbatch holds whole examples (all K copies)
    if static_rows is not None:
        if static_rows % per:
            raise ValueError(_microbatch_message(static_rows, num_microbatches, k))
        return num_microbatches, static_rows // num_microbatches, losses
    check = tf.debugging.assert_equal(
        rows % per, 0, message=_microbatch_message("a short", num_microbatches, k))
    with tf.control_dependencies([check]):  # before the reshape into microbatches
        return num_microbatches, None, tf.identity(losses)


def microbatch_mask(row_mask, num_microbatches):
    """[M] 1.0 for microbatches holding a real example, from a [rows] Poisson mask.

    A padded example's copies are all padding, so the maximum over a microbatch's
    rows is its example's mask.
    """
    row_mask = tf.cast(row_mask, tf.float32)
    return tf.reduce_max(tf.reshape(row_mask, [num_microbatches, -1]), axis=1)


def _multiplicity_message(rows, k):
    return (f"augmentation_multiplicity={k} does not divide the {rows} rows of the batch: "
            f"the batch must hold {k} consecutive augmented copies of each example. Fix: "
            f"build the batches with tf_tempered.augment.augmult_batches(..., "
            f"multiplicity={k}), or give make_private the multiplicity the data has.")


def _microbatch_message(rows, num_microbatches, k):
    examples = "" if k == 1 else (f" ({k} augmented copies per example, so a multiple of "
                                   f"{num_microbatches * k} rows)")
    return (f"num_microbatches={num_microbatches} does not divide {rows} batch size"
            f"{examples}; each microbatch must hold the same number of examples. Fix: use a "
            "batch size that is a multiple of num_microbatches and drop the short last "
            "batch (tf.data: .batch(batch_size, drop_remainder=True); fit on arrays drops "
            "it for you), or set num_microbatches=None (one example per microbatch).")
