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
"""Rows a mask kept, put back at the mask's positions: ``tf.scatter_nd(tf.where(m), v,
shape)``, as tf-keras' ``SparseCategoricalCrossentropy(ignore_class=...)`` does.

``tf.boolean_mask(x, m)`` and ``tf.gather_nd(x, tf.where(m))`` keep the rows where ``m``
holds, in order; a scatter at ``tf.where(m)`` puts row k of its values at the k-th
position kept. The values go back to their own examples' rows (the batch's axis) when
they are computed row by row from rows that the same mask kept from the batch's rows in
place. Moved before (reversed, sorted), reduced over the kept rows, or combined with
rows kept from moved rows, they land on other examples' rows: REARRANGED.

The scatter's rule (row_layout_nd) returns PUT_BACK; row_layout's walk resolves it here
with its memo: the values are walked again with the gathers of the same mask as the only
sources; they must hold those on axis 0, and no other tensor that depends on the batch may
reach them. (Like the walk's reshapes, this takes a mask's rows to hold the examples in
blocks: reshaped with its order kept, ``[B·T] -> [B, T]``, it is the same mask.)

>>> import tensorflow as tf
>>> from tf_tempered.privacy import row_layout
>>> found = []
>>> @tf.function
... def put_back(x):
...     mask = x > 0
...     kept, shape = tf.where(mask), tf.shape(x, tf.int64)
...     found.extend(row_layout.batch_axis(t, {x.op}) for t in (
...         tf.scatter_nd(kept, tf.gather_nd(x, kept) * 2.0, shape),
...         tf.scatter_nd(kept, tf.exp(tf.boolean_mask(x, mask)), shape),
...         tf.scatter_nd(kept, tf.reverse(tf.gather_nd(x, kept), [0]), shape),
...         tf.scatter_nd(kept, tf.gather_nd(x, kept) - tf.reduce_mean(x), shape),
...         tf.tensor_scatter_nd_update(x, kept, tf.boolean_mask(x, mask)[::-1])))
>>> put_back(tf.ones((4, 3)))
>>> found
[0, 0, REARRANGED, MIXED, REARRANGED]

Two masks are one only when they are provably the same values: of two variables' reads
(each a placeholder in the function), they are not.

>>> found.clear()
>>> scale, other_scale = tf.Variable(1.0), tf.Variable(1.0)
>>> @tf.function
... def two_masks(x):
...     kept, other = tf.where(x * scale > 0), tf.where(x * other_scale > 0)
...     found.extend(row_layout.batch_axis(t, {x.op}) for t in (
...         tf.scatter_nd(kept, tf.gather_nd(x, kept), tf.shape(x, tf.int64)),
...         tf.scatter_nd(kept, tf.gather_nd(x, other), tf.shape(x, tf.int64))))
>>> two_masks(tf.ones((4, 3)))
>>> found
[0, REARRANGED]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout_marks import REARRANGED, Mark, source_of, static_values

__all__ = ["PUT_BACK", "SCATTERS", "mask_of", "resolve"]

# A scatter rule's result that the walk resolves with ``resolve``.
PUT_BACK = Mark("PUT_BACK")
# The scatters' (target, indices, updates) positions among their inputs (no target:
# tf.scatter_nd's zeros of a given shape).
SCATTERS = {"ScatterNd": (None, 0, 1),
            **{name: (0, 1, 2) for name in (
                "TensorScatterUpdate", "TensorScatterAdd", "TensorScatterSub",
                "TensorScatterMax", "TensorScatterMin")}}


def mask_of(positions):
    """The mask whose kept positions ``positions`` are (``tf.where(m)``, squeezed for
    tf.boolean_mask's rows), through identities, casts and reshapes (which keep the order
    of its elements), or None."""
    where = source_of(positions, ("Identity", "Cast", "Squeeze"))
    if where.op.type != "Where":
        return None
    return source_of(where.op.inputs[0], ("Identity", "Cast", "Reshape"))


def resolve(op, memo, walk):
    """The layout of scatter ``op`` at a mask's positions. ``memo``: the walk's (op ->
    layout); ``walk(tensor, sources, memo)``: row_layout.batch_axis."""
    target, indices, updates = SCATTERS[op.type]
    where_input = source_of(op.inputs[indices], ("Identity", "Cast", "Squeeze")).op.inputs[0]
    placed = [_outer(memo, where_input)]
    if target is not None:
        placed.append(_outer(memo, op.inputs[target]))
    if any(layout not in (None, 0) for layout in placed):
        return REARRANGED  # positions (or a target) whose rows are not the batch's in place
    values = op.inputs[updates]
    if _outer(memo, values) is None:  # each example's own positions filled
        return 0 if 0 in placed else None
    kept = _gathers_kept_by(mask_of(op.inputs[indices]), values, memo)
    inner = {}
    if walk(values, kept, inner) != 0:
        return REARRANGED  # the kept rows moved, or reduced over, before they are put back
    for key, layout in inner.items():
        if layout is None and _outer(memo, key) is not None:
            return REARRANGED  # other batch rows combined with the kept ones
    return 0


def _gathers_kept_by(mask, values, memo):
    """The ops reaching ``values`` that keep, from the batch's rows in place, the rows
    where ``mask`` holds (tf.boolean_mask's gather, tf.gather_nd at tf.where)."""
    found, seen, stack = set(), set(), [values.op]
    while stack:
        op = stack.pop()
        if op in seen:
            continue
        seen.add(op)
        if _keeps_rows_of(op, mask, memo):
            found.add(op)
            continue
        stack.extend(t.op for t in op.inputs if _outer(memo, t) is not None)
    return found


def _keeps_rows_of(op, mask, memo):
    if op.type not in ("GatherV2", "GatherNd") or _outer(memo, op.inputs[0]) != 0:
        return False
    if not _same_values(mask_of(op.inputs[1]), mask):
        return False
    if op.type == "GatherNd":
        return op.inputs[1].shape.rank == 2
    try:
        return (static_values(op.inputs[2]) == [0] and op.get_attr("batch_dims") == 0
                and op.inputs[1].shape.rank == 1)
    except ValueError:
        return False


def _same_values(a, b, depth=4):
    """Whether tensors ``a`` and ``b`` hold the same values: one tensor, equal constants,
    or the same op on the same inputs (``t > 0`` written twice; not two variables' reads)."""
    if a is None or b is None:
        return False
    if a is b:
        return True
    static_a, static_b = tf.get_static_value(a), tf.get_static_value(b)
    if static_a is not None or static_b is not None:
        return (static_a is not None and static_b is not None
                and static_a.shape == static_b.shape and bool((static_a == static_b).all()))
    # Ops without inputs (placeholders: two captured variables' handles) are the same
    # only as one tensor.
    return (depth > 0 and a.op.inputs and a.op.type == b.op.type
            and a.value_index == b.value_index
            and a.op.node_def.attr == b.op.node_def.attr and len(a.op.inputs) == len(b.op.inputs)
            and not a.op.type.startswith(("Random", "Stateless", "Stateful"))
            and all(_same_values(x, y, depth - 1) for x, y in zip(a.op.inputs, b.op.inputs)))


def _outer(memo, tensor_or_op):
    """The walk's layout of an op (a tensor's), None when it was not reached."""
    op = getattr(tensor_or_op, "op", tensor_or_op)
    return memo.get(op)
