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
"""On which axis a traced tensor holds the batch's examples, or whether its rows were
rearranged across examples.

A handler splits a layer's input along its first axis into the batch's examples in
blocks: rows [i·k, (i+1)·k) are example i's. Ops between layers can break that while the
first axis stays a multiple of the batch: ``tf.concat([a, b], 0)`` of two batch tensors
(example i's rows at i and B + i), a transpose to time-major, a tile, reverse, roll or
gather of the batch's rows, ``tf.stack([a, b])`` merged by a reshape. ``batch_axis``
follows the batch axis from the model's inputs (and the outputs of recorded layer calls,
whose inputs are checked themselves) through the graph:

* an int: the axis holding the examples (0: example-major);
* ``REARRANGED``: rows of different examples interleaved or reordered;
* ``MIXED``: values computed from several examples (a mean, sum, max, cumulative sum or
  softmax over the batch's axis, a matmul contracting it, a [B, B] matrix of pairs,
  batch normalization with the batch's statistics);
* None: no dependence on the batch (its length aside); ``UNKNOWN``: an op this walk does
  not follow (a loop, a call, a scatter): nothing is claimed.

Ops that could restore the layout (reshape, split, unstack, slice, gather) turn
``REARRANGED`` into ``UNKNOWN``: only a definite rearrangement reaches a layer as one.
Nothing unmixes: ``MIXED`` stays.

>>> import tensorflow as tf
>>> found = []
>>> @tf.function
... def where(a, b):
...     found.extend(batch_axis(t, {a.op, b.op}) for t in (
...         tf.concat([a, b], 0), tf.concat([a, b], 1), tf.transpose(a, [1, 0, 2]),
...         tf.transpose(tf.transpose(a, [1, 0, 2]), [1, 0, 2]),
...         tf.reshape(tf.stack([a, b], axis=1), [-1, 3]), tf.reshape(tf.stack([a, b]), [-1, 3]),
...         tf.tile(a, [2, 1, 1]), tf.repeat(a, 2, axis=0), tf.range(4) * 2))
>>> where(tf.ones((2, 4, 3)), tf.ones((2, 4, 3)))
>>> found
[REARRANGED, 0, 1, 0, 0, REARRANGED, REARRANGED, 0, None]
>>> found.clear()
>>> @tf.function
... def mixed(a):
...     found.extend(batch_axis(t, {a.op}) for t in (
...         a - tf.reduce_mean(a, axis=0), a - tf.reduce_mean(a, axis=[1, 2], keepdims=True),
...         tf.einsum("btd,bsd->bts", a, a), tf.einsum("btd,ctd->bc", a, a),
...         tf.matmul(a[:, 0], a[:, 0], transpose_b=True), tf.math.cumsum(a[:, -1], axis=0)))
>>> mixed(tf.ones((2, 4, 3)))
>>> found
[MIXED, 0, 0, MIXED, MIXED, MIXED]
"""

from tf_tempered._compat import tf

# Ops that read a tensor's shape, not its values: a length is no data of the batch.
_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank"})

__all__ = ["MIXED", "REARRANGED", "UNKNOWN", "batch_axis"]


class _Mark:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


REARRANGED = _Mark("REARRANGED")
MIXED = _Mark("MIXED")
UNKNOWN = _Mark("UNKNOWN")


def batch_axis(tensor, sources, memo=None):
    """The layout of ``tensor`` (module docstring); ``sources``: ops whose outputs hold the
    examples on axis 0; ``memo``: op -> layout, shared between calls on one graph."""
    memo = {} if memo is None else memo
    stack = [(tensor.op, False)]
    while stack:
        op, expanded = stack.pop()
        if op in memo:
            continue
        if op in sources:
            memo[op] = 0
        elif expanded:
            memo[op] = _follow(op, [memo[t.op] for t in op.inputs])
        else:
            stack.append((op, True))
            stack.extend((t.op, False) for t in op.inputs if t.op not in memo)
    return memo[tensor.op]


def _follow(op, layouts):
    if all(layout is None for layout in layouts) or op.type in _SHAPE_ONLY:
        return None  # no batch in it, or only its length
    if MIXED in layouts:
        return MIXED  # nothing unmixes
    rule = _RULES.get(op.type, _same_axes)
    try:
        return rule(op, layouts)
    except (TypeError, ValueError, IndexError):  # a static value or shape not known
        return UNKNOWN


def _one(layouts):
    """The one layout of the batch-dependent inputs, REARRANGED if one is, else UNKNOWN
    when they disagree."""
    found = {layout for layout in layouts if layout is not None}
    if REARRANGED in found:
        return REARRANGED
    return found.pop() if len(found) == 1 else UNKNOWN


def _same_axes(op, layouts):
    """Elementwise ops, matmuls, convolutions, reductions over other axes, ...: the axis
    is kept when the output's rank is that of every batch-dependent input."""
    layout = _one(layouts)
    if layout is REARRANGED or layout is UNKNOWN or not op.outputs:
        return layout
    ranks = {t.shape.rank for t, found in zip(op.inputs, layouts) if found is not None}
    return layout if ranks == {op.outputs[0].shape.rank} != {None} else UNKNOWN


def _static(tensor):
    value = tf.get_static_value(tensor)
    if value is None:
        raise ValueError("not static")
    return [int(v) for v in tf.nest.flatten(value.tolist())]


def _static_at(tensor, index):
    """Element ``index`` of a static vector, also of a tf.stack of scalars some of which
    are not static (tf.repeat's multiples)."""
    if tensor.op.type == "Pack" and tf.get_static_value(tensor) is None:
        return _static(tensor.op.inputs[index])[0]
    return _static(tensor)[index]


def _axis(value, rank):
    return value + rank if value < 0 else value


def _transpose(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    return _static(op.inputs[1]).index(layout)


def _concat(op, layouts):
    values, rank = layouts[:-1], op.outputs[0].shape.rank
    layout = _one(values)
    if not isinstance(layout, int):
        return layout
    if len(values) > 1 and _axis(_static(op.inputs[-1])[0], rank) == layout:
        return REARRANGED  # the rows of several tensors (or of a batch and others), in turn
    return layout


def _pack(op, layouts):
    layout = _one(layouts)
    if not isinstance(layout, int):
        return layout
    axis = _axis(op.get_attr("axis"), op.outputs[0].shape.rank)
    return layout + 1 if axis <= layout else layout


def _unpack(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return UNKNOWN
    axis = _axis(op.get_attr("axis"), op.inputs[0].shape.rank)
    if axis == layout:
        return UNKNOWN  # one example per output: a loop over the examples may stack them again
    return layout - 1 if axis < layout else layout


def _expand_dims(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    axis = _axis(_static(op.inputs[1])[0], op.outputs[0].shape.rank)
    return layout + 1 if axis <= layout else layout


def _squeeze(op, layouts):
    layout, rank = layouts[0], op.inputs[0].shape.rank
    if not isinstance(layout, int):
        return layout
    axes = [_axis(a, rank) for a in op.get_attr("squeeze_dims")]
    if not axes or layout in axes:
        return UNKNOWN
    return layout - sum(a < layout for a in axes)


def _reshape(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return UNKNOWN  # a reshape may undo a rearrangement
    if layout == 0:
        return 0  # example-major rows merged or split: still example-major
    before, after = op.inputs[0].shape, op.outputs[0].shape
    if after.rank is None:
        return UNKNOWN
    if after.rank > layout and before[:layout + 1].as_list() == after[:layout + 1].as_list():
        return layout
    return REARRANGED  # the batch axis merged with the axes before it: rows in their order


def _on_batch_axis(attribute_input):
    """Ops whose listed axes (static input ``attribute_input``) rearrange rows when the
    batch axis is among them: reverse, roll."""
    def rule(op, layouts):
        layout = layouts[0]
        if not isinstance(layout, int):
            return layout
        rank = op.inputs[0].shape.rank
        axes = [_axis(a, rank) for a in _static(op.inputs[attribute_input])]
        return REARRANGED if layout in axes else layout
    return rule


def _tile(op, layouts):
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    return REARRANGED if _static_at(op.inputs[1], layout) != 1 else layout


def _gather(op, layouts):
    params, indices = layouts[0], layouts[1]
    if params is REARRANGED or indices is REARRANGED or (params is not None
                                                         and indices is not None):
        return UNKNOWN
    axis = _static(op.inputs[2])[0] if op.type == "GatherV2" else 0
    axis = _axis(axis, op.inputs[0].shape.rank)
    if isinstance(params, int):
        if params == axis:
            return REARRANGED  # rows of the batch picked by index
        return params if params < axis else params + op.inputs[1].shape.rank - 1
    return axis + indices if isinstance(indices, int) else UNKNOWN


def _resource_gather(op, layouts):
    return layouts[1] if isinstance(layouts[1], int) else UNKNOWN


def _split(op, layouts):
    value, axis_input = (1, 0) if op.type == "Split" else (0, 2)
    layout = layouts[value]
    if not isinstance(layout, int):
        return UNKNOWN
    axis = _axis(_static(op.inputs[axis_input])[0], op.inputs[value].shape.rank)
    return UNKNOWN if axis == layout else layout


def _einsum(op, layouts):
    inputs, output = op.get_attr("equation").decode().replace(" ", "").split("->")
    letters = set()
    for names, layout in zip(inputs.split(","), layouts):
        if layout is None:
            continue
        if not isinstance(layout, int) or "." in names:
            return UNKNOWN
        letters.add(names[layout])
    if any(letter not in output for letter in letters) or len(letters) > 1:
        return MIXED  # the batch's letter summed over, or pairs of examples
    return output.index(letters.pop())


def _matmul(op, layouts):
    """[m, k]·[k, n]: the batch on a contracted axis, or on both free axes (pairs of
    examples), mixes examples; on one free axis it is that output axis."""
    x = (0, 1) if op.get_attr("transpose_a") else (1, 0)  # (contracted, free) axes
    y = (1, 0) if op.get_attr("transpose_b") else (0, 1)
    return _product(op, layouts, (x, y), ranks=(2, 2))


def _batch_matmul(op, layouts):
    ranks = [t.shape.rank for t in op.inputs[:2]]
    if None in ranks or op.outputs[0].shape.rank is None:
        return UNKNOWN
    (rx, ry) = ranks
    x = (rx - 2, rx - 1) if op.get_attr("adj_x") else (rx - 1, rx - 2)
    y = (ry - 1, ry - 2) if op.get_attr("adj_y") else (ry - 2, ry - 1)
    return _product(op, layouts, (x, y), ranks)


def _product(op, layouts, axes, ranks):
    """Where the batch goes through a (batched) matrix product; ``axes``: (contracted,
    free) axis of each operand."""
    rank, found = op.outputs[0].shape.rank, set()
    for layout, (contracted, free), r, out in zip(layouts, axes, ranks, (-2, -1)):
        if layout is None:
            continue
        if not isinstance(layout, int):
            return layout
        if layout == contracted:
            return MIXED
        found.add(rank + out if layout == free else layout + rank - r)  # free, or batch dim
    if found == {rank - 2, rank - 1}:
        return MIXED  # [.., B, B]: pairs of examples
    return found.pop() if len(found) == 1 else UNKNOWN


def _reduction(op, layouts):
    layout, rank = layouts[0], op.inputs[0].shape.rank
    if not isinstance(layout, int):
        return layout
    axes = [_axis(a, rank) for a in _static(op.inputs[1])]
    if layout in axes:
        return MIXED  # a statistic of the batch
    return layout if op.get_attr("keep_dims") else layout - sum(a < layout for a in axes)


def _along_one_axis(drops):
    def rule(op, layouts):
        layout = layouts[0]
        if not isinstance(layout, int):
            return layout
        axis = _axis(_static(op.inputs[1])[0], op.inputs[0].shape.rank)
        if axis == layout:
            return MIXED
        return layout - 1 if drops and axis < layout else layout
    return rule


def _last_axis(op, layouts):
    layout = layouts[0]
    if isinstance(layout, int) and layout == op.inputs[0].shape.rank - 1:
        return MIXED  # a softmax over the examples
    return _same_axes(op, layouts)


def _fused_batch_norm(op, layouts):
    if op.get_attr("is_training") and layouts[0] is not None:
        return MIXED  # normalized with the batch's statistics
    return UNKNOWN


def _unknown(op, layouts):
    return UNKNOWN


def _slice(op, layouts):
    layout = layouts[0]
    if layout is REARRANGED:
        return UNKNOWN
    if op.type != "StridedSlice" or not isinstance(layout, int) or any(
            op.get_attr(mask) for mask in ("ellipsis_mask", "new_axis_mask")):
        return _same_axes(op, layouts)
    shrunk = op.get_attr("shrink_axis_mask")  # x[:, 0], x[:, -1]: axes dropped
    if shrunk >> layout & 1:
        return UNKNOWN  # one example's rows
    return layout - bin(shrunk & ((1 << layout) - 1)).count("1")


_RULES = {
    "Transpose": _transpose, "ConcatV2": _concat, "Pack": _pack, "Unpack": _unpack,
    "ExpandDims": _expand_dims, "Squeeze": _squeeze, "Reshape": _reshape,
    "ReverseV2": _on_batch_axis(1), "Roll": _on_batch_axis(2), "Tile": _tile,
    "GatherV2": _gather, "Gather": _gather, "ResourceGather": _resource_gather,
    "Split": _split, "SplitV": _split, "Einsum": _einsum, "MatMul": _matmul,
    "Slice": _slice, "StridedSlice": _slice,
    **{name: _unknown for name in ("While", "StatelessWhile", "If", "StatelessIf",
                                   "PartitionedCall", "StatefulPartitionedCall", "GatherNd",
                                   "ScatterNd", "TensorScatterUpdate", "SpaceToBatchND",
                                   "BatchToSpaceND", "SpaceToDepth", "DepthToSpace")},
    **{name: _reduction for name in ("Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
                                     "EuclideanNorm")},
    "ArgMax": _along_one_axis(drops=True), "ArgMin": _along_one_axis(drops=True),
    **{name: _along_one_axis(drops=False) for name in ("Cumsum", "Cumprod",
                                                       "CumulativeLogsumexp")},
    "Softmax": _last_axis, "LogSoftmax": _last_axis, "L2Loss": lambda op, layouts: MIXED,
    "BatchMatMulV2": _batch_matmul, "BatchMatMulV3": _batch_matmul,
    **{name: _fused_batch_norm for name in ("FusedBatchNorm", "FusedBatchNormV2",
                                            "FusedBatchNormV3")},
}
