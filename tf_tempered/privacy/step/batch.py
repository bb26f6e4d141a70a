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
"""Stage 1 of the DP step: the batch as the step sees it.

A batch from Keras is ``x``, ``y`` and an optional sample weight. A Poisson batch
(:func:`~tf_tempered.privacy.sampling.poisson_batches`) carries instead of the weight
the dict ``{"mask", "expected_batch_size"}`` (and ``"sample_weight"`` when the data has
weights): ``mask`` is 1.0 for a sampled example and 0.0 for a padding row, and the
expected batch size q·N is the normaliser of the update.
"""

import dataclasses
from typing import Any

from tf_tempered._compat import tf
from tf_tempered import keras_bridge

__all__ = ["Batch", "masked_rows", "unpack_batch", "unpack_sample_weight", "POISSON_KEYS"]

POISSON_KEYS = frozenset({"mask", "expected_batch_size"})
_OPTIONAL_KEYS = frozenset({"sample_weight"})


@dataclasses.dataclass(frozen=True)
class Batch:
    """One training batch.

    ``loss_weight``: what weighs each row's loss (the user's sample weight, times the
    Poisson mask), or None; ``user_weight``: the user's sample weight alone, or None;
    ``poisson_mask``: [rows] 1.0/0.0, or None (not Poisson); ``normalizer``: the
    expected batch size of a Poisson batch, or None (the number of microbatches is the
    normaliser then).
    """

    x: Any
    y: Any
    loss_weight: Any
    user_weight: Any
    poisson_mask: Any
    normalizer: Any


def unpack_sample_weight(sample_weight):
    """(weight for the loss, user weight, Poisson mask or None, normaliser or None)."""
    if not isinstance(sample_weight, dict) or not POISSON_KEYS & set(sample_weight):
        return sample_weight, sample_weight, None, None
    keys = set(sample_weight)
    if not POISSON_KEYS <= keys and not keys <= POISSON_KEYS | _OPTIONAL_KEYS:
        # Per-output weights of a model with an output named "mask" (probe U, F4).
        return sample_weight, sample_weight, None, None
    if not POISSON_KEYS <= keys <= POISSON_KEYS | _OPTIONAL_KEYS:
        raise ValueError(
            "A dict sample weight must be the Poisson-batch structure "
            "{'mask', 'expected_batch_size'} (and 'sample_weight') from "
            f"tf_tempered.privacy.poisson_batches; got keys {sorted(keys)}. Fix: pass each "
            "batch's info dict on as poisson_batches made it (a map: lambda x, y, info: "
            "(f(x), y, info)); for per-example weights, poisson_batches(x, y, "
            "sample_weight=...).")
    mask = sample_weight["mask"]
    weight, user = mask, sample_weight.get("sample_weight")
    if user is not None:  # (a structure for a model with several outputs)
        weight = tf.nest.map_structure(lambda w: masked_rows(w, mask), user)
    return weight, user, mask, sample_weight["expected_batch_size"]


def masked_rows(weight, mask):
    """``weight`` [rows, ...] times the [rows] mask, row by row (never along a later axis
    that happens to have as many entries as the batch has rows).

    >>> masked_rows(tf.ones([2, 2]), tf.constant([1.0, 0.0])).numpy()
    array([[1., 1.],
           [0., 0.]], dtype=float32)
    """
    weight = tf.cast(weight, mask.dtype)
    rank = weight.shape.rank
    if rank is None or rank <= 1:
        return weight * mask
    return weight * tf.reshape(mask, [-1] + [1] * (rank - 1))


def _checked_weights(weight):
    """``weight`` with an in-graph check that no weight is negative (not under XLA)."""
    if weight is None or isinstance(weight, dict) or not isinstance(weight, tf.Tensor):
        return weight
    check = tf.debugging.assert_non_negative(
        weight, message="sample_weight has a negative or NaN entry: DP-SGD weighs each "
                        "example's loss before clipping, and such a weight is refused. Fix: "
                        "pass finite weights >= 0.")
    with tf.control_dependencies([check]):
        return tf.identity(weight)


def with_declared_shapes(x, declared):
    """``x`` with the static shapes of the model's Inputs where its own are less known.

    tf-keras batches a Python generator or a Sequence with every dimension unknown;
    the handlers size their paths from static shapes (a Dense's input width, a Conv2D's
    image size), which the model's Inputs declare. ``declared``: [(name, TensorShape)]
    (keras_bridge.declared_input_shapes), matched to x as Keras matches inputs: one
    tensor, a list or tuple in order, or a dict by name. tf.ensure_shape checks them.
    """
    if not declared:
        return x
    if isinstance(x, dict):
        by_name = dict(declared)
        return {k: _refined(v, by_name.get(k)) for k, v in x.items()}
    if type(x) in (list, tuple) and len(x) == len(declared):  # not a namedtuple's fields
        return type(x)(_refined(v, shape) for v, (_, shape) in zip(x, declared))
    return _refined(x, declared[0][1]) if len(declared) == 1 else x


def _refined(x, shape):
    if shape is None or not isinstance(x, tf.Tensor) or x.shape.is_fully_defined() \
            or not x.shape.is_compatible_with(shape):
        return x  # incompatible: Keras' own input check names the mismatch
    merged = x.shape.merge_with(shape)
    return x if merged == x.shape else tf.ensure_shape(x, merged)


def unpack_batch(data, *, xla=False, input_shapes=None):
    """The Batch of one element of the training data (Keras' (x, y, sample_weight));
    ``input_shapes``: the model's declared inputs (:func:`with_declared_shapes`)."""
    x, y, sample_weight = keras_bridge.unpack_x_y_sample_weight(data)
    x = with_declared_shapes(x, input_shapes)
    _refuse_an_empty_batch(x)
    weight, user, mask, normalizer = unpack_sample_weight(sample_weight)
    if not xla and weight is not None:
        weight = tf.nest.map_structure(_checked_weights, weight)
    return Batch(x, y, weight, user, mask, normalizer)


def _refuse_an_empty_batch(x):
    """A step traced for 0 rows would divide by its 0 examples; under tf.distribute it is
    a last batch that leaves a replica none."""
    if any(isinstance(t, tf.Tensor) and t.shape.rank and t.shape[0] == 0
           for t in tf.nest.flatten(x)):
        raise ValueError(
            "A DP step traced for a batch of 0 rows (under tf.distribute, the last batch of a "
            "dataset that leaves a replica no rows). Fix: .batch(B, drop_remainder=True) with "
            "a B the replicas divide, before strategy.experimental_distribute_dataset.")
