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
"""How ops move the batch's axis, or rearrange its rows: the rules of row_layout's walk,
with the layouts they return (an axis, REARRANGED, MIXED, UNKNOWN, None).

Each rule takes the op and the layouts of its inputs (at least one not None) and returns
its outputs' layout; a static value it needs that is not known makes it UNKNOWN.
"""

import numpy as np

from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, UNKNOWN, Picked, batch_rows,
                                                  check_rows_later, is_picked, normalized_axis,
                                                  one_layout, same_axes, static_at,
                                                  static_values)

__all__ = ["RULES"]


def _transpose(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    try:
        return static_values(op.inputs[1]).index(layout)
    except ValueError:  # a permutation built at run time (tf.nn.softmax(x, axis=0)'s)
        # The output axis with the batch axis's length, if only one has it (the batch's
        # length unknown while tracing: the one unknown dimension).
        size = op.inputs[0].shape.as_list()[layout]
        before = op.inputs[0].shape.as_list()
        after = op.outputs[0].shape.as_list()
        if before.count(size) != 1 or after.count(size) != 1:
            return UNKNOWN
        return after.index(size)


def _concat(op, layouts):
    values, rank = layouts[:-1], op.outputs[0].shape.rank
    if _all_picked(values) and normalized_axis(static_values(op.inputs[-1])[0], rank) == 0:
        return _restacked(values)
    layout = one_layout(values)
    if not isinstance(layout, int):
        return layout
    if len(values) > 1 and normalized_axis(static_values(op.inputs[-1])[0], rank) == layout:
        return REARRANGED  # the rows of several tensors (or of a batch and others), in turn
    return layout


def _all_picked(layouts):
    """Rows picked by their indices only (put together on the first axis: see _restacked;
    on another axis, rows of different examples side by side are MIXED)."""
    found = [layout for layout in layouts if layout is not None]
    return bool(found) and all(map(is_picked, found))


def _restacked(layouts):
    """Picked rows put together on the first axis, by static indices: in the batch's order
    from its first example (tf.stack([f(e) for e in tf.unstack(x)]), tf.split's parts
    concatenated again), the batch's axis; in another order (tf.stack(tf.unstack(x)[::-1]),
    a row twice, the second half first), REARRANGED; one row, still that row (also one
    picked by a loop's index: ``[x[i]]``, a scatter's update). Several picked by a loop's
    index, nothing is claimed."""
    if len(layouts) == 1:
        return layouts[0]
    positions = []
    for layout in layouts:
        keys = list(layout.keys) if is_picked(layout) else []
        if len(keys) != 1 or keys[0][0] not in ("index", "part"):
            return UNKNOWN
        positions.append(keys[0][1])
    if len(positions) == 1:
        return layouts[0]
    return 0 if positions == list(range(len(positions))) else REARRANGED


def _pack(op, layouts):
    if _all_picked(layouts) and op.get_attr("axis") == 0:
        return _restacked(layouts)
    layout = one_layout(layouts)
    if not isinstance(layout, int):
        return layout
    axis = normalized_axis(op.get_attr("axis"), op.outputs[0].shape.rank)
    return layout + 1 if axis <= layout else layout


def _unpack(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):  # rearranged rows stay so, along any axis
        return layout if is_picked(layout) or layout is REARRANGED else UNKNOWN
    axis = normalized_axis(op.get_attr("axis"), op.inputs[0].shape.rank)
    if axis == layout:  # one example per output (stacked again, they claim nothing)
        return [Picked({("index", k)}) for k in range(len(op.outputs))]
    return layout - 1 if axis < layout else layout


def _expand_dims(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    axis = normalized_axis(static_values(op.inputs[1])[0], op.outputs[0].shape.rank)
    return layout + 1 if axis <= layout else layout


def _squeeze(op, layouts):
    layout, rank = layouts[0], op.inputs[0].shape.rank
    if not isinstance(layout, int):
        return layout
    axes = [normalized_axis(a, rank) for a in op.get_attr("squeeze_dims")]
    if not axes:  # every axis of length 1: the static ones, if the output's rank says so
        axes = [a for a, size in enumerate(op.inputs[0].shape.as_list()) if size == 1]
        if op.outputs[0].shape.rank != rank - len(axes):
            return UNKNOWN
    if layout in axes:
        return UNKNOWN
    return layout - sum(a < layout for a in axes)


def _reshape(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout  # a Flatten after rearranged rows keeps them rearranged
    before, after = op.inputs[0].shape, op.outputs[0].shape
    if after.rank is None or before.rank is None:
        return UNKNOWN
    if after.rank > layout and before[:layout + 1].as_list() == after[:layout + 1].as_list():
        kept = layout  # (first: a batch of one example is an axis of length 1 too)
    elif all(size == 1 for size in before.as_list()[:layout]):
        # Example-major rows merged or split: still example-major, after the leading axes
        # of length 1 the reshape puts first (tf-keras' LayerNormalization: [1, B·T, d, 1]);
        # in a batch of one example, a first axis of 1 is that example ([T, d] -> [1, T·d]
        # put the batch on axis 1: refused; probe H3).
        kept = 0 if batch_rows() == 1 and after[0] == 1 else next(
            (i for i, size in enumerate(after.as_list()) if size != 1), None)
        if kept is None:
            return UNKNOWN
    else:
        return REARRANGED  # the batch axis merged with the axes before it: rows in their order
    # ... if its rows are still the batch's examples in blocks: a length that is no multiple
    # of the batch's merged several examples into a row ([B, F] -> [B/2, 2, F]: a mean over
    # the pair mixed examples unrefused; probe H2, F2). With the batch's length unknown while
    # tracing (an example's rows may be several, [2B, ...] -> [B, ...]), the step checks it
    # when it runs (H3: 2.2-4.9 C through tf.data batches of unknown length).
    if _row_size(before, layout) is not None and _row_size(before, layout) == _row_size(
            after, kept):
        return kept  # rows of the same size: as many as before
    rows = batch_rows()
    if rows and after[kept] is not None:
        return REARRANGED if after[kept] % rows else kept
    if not check_rows_later(op.outputs[0], kept):
        return REARRANGED  # in a function's graph no check reads it (probe P3, F1)
    return kept


def _row_size(shape, axis):
    """The static number of values in each row along ``axis`` of ``shape``, or None."""
    sizes = shape.as_list()[axis + 1:]
    return None if None in sizes else int(np.prod(sizes, dtype=np.int64))


def _on_batch_axis(attribute_input):
    """Ops whose listed axes (static input ``attribute_input``) rearrange rows when the
    batch axis is among them: reverse, roll."""
    def rule(op, layouts):
        layout = layouts[0]
        if not isinstance(layout, int):
            return layout
        rank = op.inputs[0].shape.rank
        axes = [normalized_axis(a, rank) for a in static_values(op.inputs[attribute_input])]
        return REARRANGED if layout in axes else layout
    return rule


def _tile(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    return REARRANGED if static_at(op.inputs[1], layout) != 1 else layout


def _split(op, layouts):
    value, axis_input = (1, 0) if op.type == "Split" else (0, 2)
    layout = layouts[value]
    if not isinstance(layout, int):  # rearranged rows stay so, along any axis
        return layout if is_picked(layout) or layout is REARRANGED else UNKNOWN
    axis = normalized_axis(static_values(op.inputs[axis_input])[0], op.inputs[value].shape.rank)
    if axis != layout:
        return layout
    return [Picked({("part", k, len(op.outputs))}) for k in range(len(op.outputs))]


def _each_example_s_recurrence(op, layouts):
    """tf_tempered's own LSTM and GRU time loops (native ops): [B, T, ·] inputs and [B, H]
    states, each example's recurrence over its own rows, to [B, T, ·] outputs: the batch's
    axis stays first; examples on another axis would be run through as time steps: MIXED."""
    if any(isinstance(layout, int) and layout != 0 for layout in layouts):
        return MIXED
    return one_layout(layouts)


# Elementwise ops that broadcast their inputs against each other.
_BROADCASTING = frozenset({
    "AddV2", "Add", "Sub", "Mul", "MulNoNan", "RealDiv", "Div", "DivNoNan", "TruncateDiv",
    "FloorDiv", "FloorMod", "Maximum", "Minimum", "SquaredDifference", "Pow", "Atan2",
    "Xdivy", "Xlogy", "Xlog1py", "Equal", "NotEqual", "Less", "LessEqual", "Greater",
    "GreaterEqual", "LogicalAnd", "LogicalOr", "SelectV2"})


def _broadcast(op, layouts):
    """An elementwise op: each input's batch axis lands on the output's axis counted from
    the right. Examples landing on two axes pair every example with every other
    (``e[:, None] * e[None]``, labels [B] against predictions [B, 1]): MIXED; so does the
    batch against rows picked from it (``t - tf.gather(t, [0])``, ``t * t[0, 0]``)."""
    rank = op.outputs[0].shape.rank if op.outputs else None
    marks = {layout for layout in layouts if layout is not None and not isinstance(layout, int)}
    axes = {layout + rank - t.shape.rank for t, layout in zip(op.inputs, layouts)
            if isinstance(layout, int) and rank is not None and t.shape.rank is not None}
    if len(axes) > 1 or axes and (REARRANGED in marks or any(map(is_picked, marks))):
        return MIXED
    return same_axes(op, layouts)


def _pad(op, layouts):
    """tf.pad: rows added before or after the batch's shift or extend it, REARRANGED; its
    padding known only while the step runs (tf.pad(t, [[k, 0], ...])), REARRANGED too."""
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    try:
        return REARRANGED if any(_padding_of(op.inputs[1], layout)) else layout
    except ValueError:
        return REARRANGED


def _padding_of(paddings, axis):
    """[before, after] of one axis in a [rank, 2] paddings tensor: static, or a row of a
    tf.stack of rows, or two of a flat tf.stack of scalars reshaped (tf.image's
    pad_to_bounding_box; paddings of other axes known only while the step runs)."""
    try:
        return static_values(paddings)[2 * axis:2 * axis + 2]
    except ValueError:
        if paddings.op.type == "Reshape" and paddings.op.inputs[0].shape.rank == 1:
            flat = paddings.op.inputs[0]  # row-major: [before, after] of axis k at 2k, 2k + 1
            if flat.op.type == "Pack":
                return [static_values(t)[0] for t in flat.op.inputs[2 * axis:2 * axis + 2]]
            return static_values(flat)[2 * axis:2 * axis + 2]
        if paddings.op.type != "Pack" or paddings.op.get_attr("axis") != 0:
            raise
        return static_values(paddings.op.inputs[axis])


def _values_unread(op, layouts):
    """tf.zeros_like, tf.ones_like: picked rows' shape is read, not their values."""
    return None if is_picked(layouts[0]) else same_axes(op, layouts)


def _shuffle(op, layouts):
    return REARRANGED if layouts[0] == 0 else UNKNOWN


RULES = {
    "Transpose": _transpose, "ConcatV2": _concat, "Pack": _pack, "Unpack": _unpack,
    "ExpandDims": _expand_dims, "Squeeze": _squeeze, "Reshape": _reshape,
    "ReverseV2": _on_batch_axis(1), "Roll": _on_batch_axis(2), "Tile": _tile,
    "Split": _split, "SplitV": _split,
    "Pad": _pad, "PadV2": _pad, "MirrorPad": _pad, "RandomShuffle": _shuffle,
    "ZerosLike": _values_unread, "OnesLike": _values_unread,
    "TfTemperedLstmSequence": _each_example_s_recurrence,
    "TfTemperedGruSequence": _each_example_s_recurrence,
    **{name: _broadcast for name in _BROADCASTING},
}
