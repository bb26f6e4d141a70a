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
"""Row layouts through gathers (``tf.gather``, ``tf.gather_nd``) and scatters (rules of
row_layout's walk).

``tf.gather`` on the batch's axis picks one example's rows by a scalar index (PICKED), or
rows of any examples by a vector (REARRANGED); with ``batch_dims=1`` each example's own.

An index tuple of depth d addresses a tensor's first d axes: when they include the
batch's, each output row may come from any example, and the rows are REARRANGED (so a
batch statistic of them, or their use with the batch's rows, is MIXED), unless the first
coordinate of every index is its own row's position: ``tf.stack([tf.range(n), labels],
1)``, the label-pick idiom, and ``tf.gather_nd(..., batch_dims=1)`` (whose index TF builds so),
which keep the examples on axis 0. A scatter of the batch's rows (its updates, or indices
computed from them) places them anywhere: REARRANGED; a scatter into the batch's rows of
values that are not the batch's keeps them; rows put back at the positions a mask kept
(``tf.scatter_nd(tf.where(mask), values, shape)``, tf-keras' ``ignore_class``) are the
walk's to resolve (:mod:`tf_tempered.privacy.row_layout_masks`). Picked rows (a loop's
``x[i]`` written back at ``i``) claim nothing, as before.

>>> import tensorflow as tf
>>> from tf_tempered.privacy import row_layout
>>> found = []
>>> @tf.function
... def layouts(x, labels):
...     n = tf.shape(x)[0]
...     found.extend(row_layout.batch_axis(t, {x.op, labels.op}) for t in (
...         tf.gather_nd(x, tf.stack([tf.range(n), labels], 1)),
...         tf.gather_nd(x, labels[:, None], batch_dims=1),
...         tf.gather_nd(x, tf.range(n)[:, None]),
...         tf.gather_nd(x, tf.range(n)[:, None]) - tf.reduce_mean(x),
...         tf.gather_nd(tf.transpose(x), labels[:, None]),
...         tf.tensor_scatter_nd_update(x, [[0]], [x[1]]),
...         tf.tensor_scatter_nd_update(x, [[0]], tf.zeros([1, 3])),
...         tf.scatter_nd(tf.range(n)[:, None], x, tf.shape(x))))
>>> layouts(tf.ones((4, 3)), tf.zeros(4, tf.int32))
>>> found
[0, 0, REARRANGED, MIXED, MIXED, REARRANGED, 0, REARRANGED]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, UNKNOWN, Picked, is_picked,
                                                  normalized_axis, one_layout, picked_at,
                                                  static_values)
from tf_tempered.privacy.row_layout_masks import PUT_BACK, SCATTERS, mask_of
from tf_tempered.privacy.row_layout_positions import rows_in_order

__all__ = ["RULES"]

def _gather(op, layouts):
    params, indices = layouts[0], layouts[1]
    axis = static_values(op.inputs[2])[0] if op.type == "GatherV2" else 0
    axis = normalized_axis(axis, op.inputs[0].shape.rank)
    batch_dims = op.get_attr("batch_dims") if op.type == "GatherV2" else 0
    if params == 0 and indices in (None, 0) and batch_dims > 0:
        return 0  # each example's rows looked up by its own indices (tf.gather(..., batch_dims=1))
    if isinstance(params, int) and params == axis:
        if op.inputs[1].shape.rank == 0 and indices is None:
            return picked_at(op.inputs[1])  # one example's rows (tf.gather(x, i) in a loop)
        return REARRANGED  # rows of the batch picked by index (indices of the batch's too)
    if is_picked(params) or is_picked(indices):
        return one_layout([params, indices])  # picked rows' values, or looked up by them
    if params is REARRANGED and isinstance(indices, int):
        return MIXED  # moved rows looked up by each example's own indices
    if params is REARRANGED and indices is None:
        return REARRANGED  # moved rows stay moved, whatever is gathered, along any axis
    if params is REARRANGED or indices is REARRANGED or (params is not None
                                                         and indices is not None):
        return UNKNOWN
    if isinstance(params, int):
        return params if params < axis else params + op.inputs[1].shape.rank - 1
    return axis + indices if isinstance(indices, int) else UNKNOWN


def _resource_gather(op, layouts):
    return layouts[1] if isinstance(layouts[1], int) or is_picked(layouts[1]) else UNKNOWN


def _gather_nd(op, layouts):
    params, indices = layouts[0], layouts[1]
    depth = op.inputs[1].shape[-1]
    if depth is None:
        return UNKNOWN
    index_rank = op.inputs[1].shape.rank
    if params is REARRANGED:  # looked up by each example's own indices: a mix
        return MIXED if isinstance(indices, int) else REARRANGED
    if isinstance(params, int) and params < depth:
        if params == 0 and indices in (None, 0) and rows_in_order(op.inputs[1], op.inputs[0]):
            return 0
        if params == 0 and indices is None:
            rows = _first_coordinates(op.inputs[1])
            if rows is not None and len(set(rows)) == 1:
                return Picked({("index", rows[0])})  # one example's values: h[0, 0]
        return REARRANGED  # each output row read from any example's rows
    if is_picked(params) or is_picked(indices):
        return one_layout([params, indices])
    axes = set()
    if isinstance(params, int):
        axes.add(params - depth + index_rank - 1)
    if isinstance(indices, int):
        if indices == index_rank - 1:
            return UNKNOWN  # the examples along an index's coordinates
        axes.add(indices)
    if len(axes) > 1:
        return MIXED  # examples' rows looked up by other examples' indices: pairs
    return axes.pop() if axes else UNKNOWN


def _scatter(target, indices, updates):
    """A scatter's rule; the positions of its target, indices and updates among the
    op's inputs (target None: tf.scatter_nd's zeros of a given shape)."""
    def rule(op, layouts):
        moved = [layouts[indices], layouts[updates]]
        if any(is_picked(layout) for layout in moved):
            if layouts[indices] is None and _static_row(layouts[updates]) is not None:
                at = _first_coordinates(op.inputs[indices])
                if at is not None and set(at) != {_static_row(layouts[updates])}:
                    return REARRANGED  # tf.tensor_scatter_nd_update(x, [[0]], [x[1]])
            if layouts[indices] is None and _moved_from_its_index(op.inputs[indices],
                                                                  layouts[updates]):
                return REARRANGED  # a loop's x[i] written at row (i + 1) % n
            return UNKNOWN  # a loop's x[i] written back at i (or elsewhere: not followed)
        if mask_of(op.inputs[indices]) is not None:
            return PUT_BACK  # rows a mask kept, put back (tf-keras' ignore_class)
        placed = [layouts[updates]] + ([layouts[target]] if target is not None else [])
        if (layouts[indices] in (None, 0) and all(layout in (None, 0) for layout in placed)
                and rows_in_order(op.inputs[indices], op.inputs[updates])):
            return 0  # each example's values written into its own row
        if any(layout is not None for layout in moved):
            return REARRANGED  # the batch's rows (or rows chosen by its values) placed anywhere
        return layouts[target] if target is not None else None
    return rule


def _moved_from_its_index(indices, picked):
    """Whether a scatter's index [[c]] writes rows picked by a loop's index i at a row c
    computed from i (i + 1, (i + 1) % n), not at i itself."""
    keys = [key for key in getattr(picked, "keys", ()) if key[0] == "tensor"]
    if len(keys) != 1 or indices.shape.num_elements() != 1:
        return False
    names = {keys[0][2]}
    coordinate = indices
    while coordinate.op.type in ("Pack", "Reshape", "ExpandDims", "Identity", "Cast") \
            and len(coordinate.op.inputs) >= 1:
        coordinate = coordinate.op.inputs[0]
    if coordinate.name in names:
        return False  # written back where it was read
    pending, seen = [coordinate], set()
    while pending:  # arithmetic on the index: i + 1, i - 1, (i + 1) % n
        t = pending.pop()
        if t.name in names:
            return True
        if t.name in seen or t.op.type not in ("Add", "AddV2", "Sub", "FloorMod", "Mod",
                                                "Identity", "Cast"):
            continue
        seen.add(t.name)
        pending.extend(t.op.inputs)
    return False


def _static_row(layout):
    """The example whose rows ``layout`` picks by a static index, or None."""
    keys = list(layout.keys) if is_picked(layout) else []
    return keys[0][1] if len(keys) == 1 and keys[0][0] == "index" else None


def _first_coordinates(indices):
    try:
        value = tf.get_static_value(indices)
        return None if value is None else [int(v) for v in value.reshape(-1, value.shape[-1])[:, 0]]
    except (TypeError, ValueError, IndexError):
        return None


def _stitch(op, layouts):
    """tf.dynamic_stitch: rows of the data placed at their indices (anywhere)."""
    half = len(op.inputs) // 2
    if any(layout is not None for layout in layouts[:half]):
        return REARRANGED  # placed where the batch's values say
    return REARRANGED if any(layout is not None for layout in layouts[half:]) else None


RULES = {
    "GatherV2": _gather, "Gather": _gather, "ResourceGather": _resource_gather,
    "GatherNd": _gather_nd, "DynamicStitch": _stitch, "ParallelDynamicStitch": _stitch,
    **{name: _scatter(*inputs) for name, inputs in SCATTERS.items()},
}
