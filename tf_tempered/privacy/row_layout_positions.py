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
"""Whether a tf.gather_nd or scatter index keeps each example's rows its own: its first
coordinate in row r is r's example (rules' helper for :mod:`tf_tempered.privacy.row_layout_nd`).

The positions of the batch are a ``tf.range`` from 0 by 1 over its length; each op between
the range and the index must keep it on the index's first axis.

>>> import tensorflow as tf
>>> found = []
>>> @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None], tf.int32)])
... def kept(x, labels):
...     n = tf.shape(x)[0]
...     found.extend(rows_in_order(index, x) for index in (
...         tf.stack([tf.range(n), labels], 1),
...         tf.stack([tf.range(n)[::-1], labels], 1),
...         tf.stack([tf.broadcast_to(tf.range(n), [n, n]), tf.zeros([n, n], tf.int32)], -1)))
>>> _ = kept.get_concrete_function()
>>> found
[True, False, False]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout_marks import (first_length, normalized_axis, range_limit,
                                                  static_at, static_values)

__all__ = ["rows_in_order"]


def rows_in_order(indices, rows):
    """Whether the first coordinate of the index in row r is r's example, each of the
    ``rows``' examples in turn: the positions of the batch (a tf.range from 0 by 1 over its
    length) put first beside other coordinates (tf.stack([positions, labels], 1), a
    tf.concat of columns, tf.transpose of tf.stack([positions, labels])), repeated per
    example (tf.repeat, a tile or broadcast along later axes), as TF's batch_dims gather_nd
    builds them (a range over the first axis's length, tiled over each example's indices and
    concatenated first)."""
    op, last = indices.op, (-1, indices.shape.rank - 1)
    if op.type == "Pack" and op.get_attr("axis") in last:
        return _positions(op.inputs[0], rows)
    if op.type == "ConcatV2" and static_values(op.inputs[-1])[0] in last:
        return _positions(op.inputs[0], rows)
    if (op.type == "Transpose" and static_values(op.inputs[1]) == [1, 0]
            and op.inputs[0].op.type == "Pack" and op.inputs[0].op.get_attr("axis") == 0):
        return _positions(op.inputs[0].op.inputs[0], rows)
    return False


def _positions(tensor, rows):
    """Whether ``tensor``'s first axis holds 0, 1, ... over ``rows``' first axis (each
    value repeated along later axes, as tf.meshgrid's first output, or in blocks:
    tf.repeat). Each op between it and the tf.range must keep the range on axis 0: a
    broadcast or a product by ones of the same rank, new axes after the first, a tile that
    does not repeat axis 0, a reshape that flattens or adds trailing axes of length 1 (the
    positions broadcast along another axis, tf.broadcast_to(tf.range(n), [n, n]), put every
    example's rows in each row)."""
    t = tensor
    while t.op.inputs:
        op = t.op
        if op.type in ("Identity", "Cast") or (
                op.type == "ExpandDims" and _axis_after_the_first(op)
                or op.type == "BroadcastTo" and _keeps_the_first_axis(op.inputs[0], op)
                or op.type == "Tile" and _first_multiple_is_one(op)
                or op.type == "Reshape" and _keeps_row_order(op)
                or op.type == "StridedSlice" and _only_new_axes(op)):
            t = op.inputs[0]
        elif _first_of_a_transposed_stack(op):
            t = op.inputs[0].op.inputs[0]
        elif _times_ones(op) is not None and _keeps_the_first_axis(_times_ones(op), op):
            t = _times_ones(op)
        else:
            break
    limit = range_limit(t)
    return limit is not None and _is_length_of(limit, rows)


def _axis_after_the_first(op):
    """tf.expand_dims(t, axis) with axis ≥ 1 (counted in the output): t's axis 0 stays first."""
    try:
        return normalized_axis(static_values(op.inputs[1])[0], op.outputs[0].shape.rank) >= 1
    except (TypeError, ValueError, IndexError):
        return False


def _keeps_the_first_axis(operand, op):
    """A broadcast of ``operand`` by ``op`` keeps its axis 0 as the output's: the same rank
    (a lower one is aligned with the last axes) and an axis 0 not of length 1."""
    rank = operand.shape.rank
    return (rank is not None and rank == op.outputs[0].shape.rank and rank >= 1
            and operand.shape[0] != 1)


def _is_length_of(limit, rows):
    """Whether ``limit`` is the length of ``rows``' first axis: the same static value, or
    tf.shape(t)[0] of a tensor whose first axis has ``rows``' static length (both unknown
    while tracing: the batch's)."""
    value = tf.get_static_value(limit)
    if value is None:
        measured, value = first_length(limit) or (None, None)
        if measured is not None:
            return bool(measured.shape.rank and measured.shape[0] == rows.shape[0])
    return value is not None and rows.shape[0] is not None and int(value) == rows.shape[0]


def _first_of_a_transposed_stack(op):
    """tf.transpose(tf.stack([a])) of one vector: a as a column, row r holds a[r] (TF's
    batch_dims=1 gather_nd builds its positions so). Of several vectors, the others' values
    would sit beside the positions, and a later reshape could move them to the first axis."""
    try:
        return (op.type == "Transpose" and static_values(op.inputs[1]) == [1, 0]
                and op.inputs[0].op.type == "Pack" and op.inputs[0].op.get_attr("axis") == 0
                and len(op.inputs[0].op.inputs) == 1
                and op.inputs[0].op.inputs[0].shape.rank == 1)
    except ValueError:
        return False


def _first_multiple_is_one(op):
    """A tile's multiples begin with a static 1 (tf.repeat stacks a 1 and its count)."""
    try:
        return static_at(op.inputs[1], 0) == 1
    except (TypeError, ValueError, IndexError):
        return False


def _times_ones(op):
    """x * tf.ones(...) (tf.meshgrid's broadcast): the operand that is not the ones, or
    None."""
    if op.type != "Mul":
        return None
    for ones, other in (op.inputs, op.inputs[::-1]):
        if ones.op.type == "Fill" and tf.get_static_value(ones.op.inputs[1]) == 1:
            return other
    return None


def _keeps_row_order(op):
    """A reshape that flattens [n, k] into n·k rows (tf.repeat) or adds axes of length 1."""
    before, after = op.inputs[0].shape, op.outputs[0].shape
    if after.rank == 1:
        return True
    if before.rank is None or after.rank is None or after.rank < before.rank:
        return False
    return (after[:before.rank].as_list() == before.as_list()
            and all(size == 1 for size in after.as_list()[before.rank:]))


def _only_new_axes(op):
    """x[:, None]: a slice that only adds axes, none before x's first (x[None] moves it)."""
    try:
        strides, begin = static_values(op.inputs[3]), static_values(op.inputs[1])
    except ValueError:
        return False
    new = op.get_attr("new_axis_mask")
    whole = op.get_attr("begin_mask") & op.get_attr("end_mask")
    return (op.get_attr("shrink_axis_mask") == 0 and op.get_attr("ellipsis_mask") == 0
            and not new & 1
            and set(strides) == {1} and set(begin) <= {0}
            and all(new >> i & 1 or whole >> i & 1 for i in range(len(strides))))
