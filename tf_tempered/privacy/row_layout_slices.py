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
"""How slices move the batch's axis (rules of row_layout's walk): ``x[...]`` (StridedSlice)
and ``tf.slice``. The whole batch axis keeps it; one row, or rows from an index known only
while the step runs (a loop's ``x[i]``, ``x[i:i + 1]``), are picked rows (keyed by that
index); a part of the examples (``t[:1]``, broadcast against the others; ``t[:n]`` with n
known only while the step runs, unless it is ``tf.shape(t)[0]``), MIXED.

>>> import tensorflow as tf
>>> from tf_tempered.privacy import row_layout
>>> found = []
>>> @tf.function
... def slices(a):
...     found.extend(row_layout.batch_axis(t, {a.op}) for t in (
...         a[:, 0], a[0], a[:1], a[..., 0], a[None, :, 1], tf.slice(a, [0, 1], [-1, 1])))
>>> slices(tf.ones((2, 3)))
>>> found
[0, PICKED, MIXED, 0, 1, 0]
"""

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, first_length, picked_at,
                                                  same_axes, source_of, static_at)

__all__ = ["RULES"]


def _slice(op, layouts):
    """tf.strided_slice (``x[...]``) and tf.slice: the whole batch axis keeps it; one row,
    or rows from an index known only while the step runs (a loop's ``x[i]``,
    ``x[i:i + 1]``), are PICKED; a static part of the examples, broadcast against the
    others (``t - t[:1]``), MIXED."""
    layout = layouts[0]
    if layout is REARRANGED:
        return REARRANGED  # a slice of shifted rows (tf.pad(t, [[1, 0], ...])[:-1])
    if not isinstance(layout, int):
        return same_axes(op, layouts)
    if op.type == "Slice":
        return _part(op, (_start(op.inputs[1], layout), layout), layout,
                     lambda: _slice_whole(op, layout), lambda: _slice_of_one(op, layout), layout)
    entry, out_axis = _strided_entry(op, layout)
    if entry is None:  # an axis the slice does not name (or an ellipsis holds): whole
        return out_axis
    if op.get_attr("shrink_axis_mask") >> entry & 1:
        return picked_at(op.inputs[1], entry)  # one example's rows (x[0], x[i])
    begin = 0 if op.get_attr("begin_mask") >> entry & 1 else _start(op.inputs[1], entry)
    if static_at(op.inputs[3], entry) != 1:
        return REARRANGED  # x[::-1]: the examples reversed (or every other one)
    return _part(op, (begin, entry), out_axis, lambda: _strided_whole(op, layout, entry),
                 lambda: _strided_one(op, entry), layout)


def _start(vector, index):
    """Element ``index`` of a slice's begin vector, or None when known only while the step
    runs (also of a vector built by a concat or a stack of static and other values)."""
    try:
        return static_at(vector, index)
    except (TypeError, ValueError, IndexError):
        try:
            return keras_bridge.partial_static_vector(vector)[index]
        except (TypeError, ValueError, IndexError):
            return None


def _part(op, start, out_axis, whole, one_row, batch_axis):
    """The layout of a slice on the batch axis (``batch_axis`` of its input); ``start``: (its
    begin, None when known only while it runs; that begin's entry in the begin vector);
    ``whole()``: whether it reaches the batch's end (raises if not known); ``one_row()``:
    whether it is one row long."""
    begin, entry = start
    if begin is None:
        if one_row():
            return picked_at(op.inputs[1], entry)  # x[i:i + 1]: one example's rows
        return MIXED  # rows of several examples from a loop's index (x[i:i + 2])
    if begin == 0:
        try:
            return out_axis if whole() else MIXED
        except (TypeError, ValueError, IndexError):
            # x[:n], n known only while it runs: all of x's rows when n is its own length
            # (x[:tf.shape(x)[0]]), else some, MIXED: one row broadcast against the batch
            # (n = 1), or rows that line up with the batch's only after a repeat.
            return (out_axis if _own_length(op, _entry(op.inputs[2], entry), batch_axis)
                    else MIXED)
    return MIXED  # some examples' rows, to be broadcast against the others' (t - t[:1])


def _entry(vector, index):
    """Element ``index`` of a slice's begin, end or size vector, as a tensor (a stack of
    scalars' own), or None."""
    return vector.op.inputs[index] if vector.op.type == "Pack" else None


def _own_length(op, end, batch_axis):
    """Whether a slice's end ``end`` is tf.shape(x)[0] of the tensor x it slices, whose batch
    axis is its first (or the constant TF folded it to, when x's batch length was known
    while tracing: a fixed-size crop, ``tf.image.crop_to_bounding_box``, was refused; probe
    S, F6). Of another axis, the first's length is not the batch's (u = h[None]:
    u[:, :tf.shape(u)[0]] is one row; probe A2, F2)."""
    measured, length = (None, None) if end is None else (first_length(end) or (None, None))
    if batch_axis != 0:
        return False
    if measured is None:
        return length is not None and length == op.inputs[0].shape[0]
    return source_of(measured) is source_of(op.inputs[0])


def _strided_one(op, entry):
    """x[i:i + 1]: the end is the begin plus one (stride 1)."""
    begin, end = _entry(op.inputs[1], entry), _entry(op.inputs[2], entry)
    if begin is None or end is None or end.op.type not in ("Add", "AddV2"):
        return False
    a, b = end.op.inputs
    return (a is begin and tf.get_static_value(b) == 1) or (
        b is begin and tf.get_static_value(a) == 1)


def _slice_of_one(op, layout):
    try:
        return static_at(op.inputs[2], layout) == 1
    except (TypeError, ValueError, IndexError):
        return False


def _slice_whole(op, layout):
    size, length = static_at(op.inputs[2], layout), op.inputs[0].shape[layout]
    return size == -1 or (length is not None and size >= length)


def _strided_whole(op, layout, entry):
    length = op.inputs[0].shape[layout]
    return bool(op.get_attr("end_mask") >> entry & 1) or (
        length is not None and static_at(op.inputs[2], entry) >= length)


def _strided_entry(op, layout):
    """(the slice's entry for the batch axis, the output's axis for it) of a StridedSlice;
    (None, output axis) when no entry names it (past the entries, or in an ellipsis)."""
    shrunk, new = op.get_attr("shrink_axis_mask"), op.get_attr("new_axis_mask")
    ellipsis = op.get_attr("ellipsis_mask")
    entries, rank = op.inputs[1].shape[0], op.inputs[0].shape.rank
    named = sum(not (new >> j & 1 or ellipsis >> j & 1) for j in range(entries))
    axis, out_axis = 0, 0  # the input's and the output's axis the next entry stands for
    for j in range(entries):
        if ellipsis >> j & 1:
            covered = rank - named
            if axis <= layout < axis + covered:
                return None, out_axis + layout - axis
            axis, out_axis = axis + covered, out_axis + covered
        elif new >> j & 1:
            out_axis += 1
        elif axis == layout:
            return j, out_axis
        else:
            axis, out_axis = axis + 1, out_axis + (not shrunk >> j & 1)
    return None, out_axis + layout - axis


RULES = {"Slice": _slice, "StridedSlice": _slice}
