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
"""Which tensor arguments of a layer call the batch's examples share, read off the trace.

The generic per-example VJP (layer_grads/generic.py) runs a layer's call on one example.
A tensor argument with the batch's length on its first axis is usually per example (a
padding mask, a causal mask tiled to the batch): example b gets row b. With static shapes
a tensor the examples share can have that length by chance (a ``[T, T]`` attention bias
with T equal to the batch size): example b must get all of it, or its gradient is wrong.

An argument is **shared** when its first axis has the batch's static length, its values do
not depend on the batch (row_layout's walk from the batch and the registered layers'
outputs), and its rows are not one row repeated by construction (`rows_alike`: a
``tf.tile``/``broadcast_to``/``repeat`` of one copy, ``tf.ones``, a constant with equal
rows; slicing such a tensor and passing it whole agree on every example). The VJP passes
shared arguments whole and checks that the call then still gives one example's output.

>>> @tf.function
... def alike():
...     mask = tf.cast(tf.range(3)[:, None] >= tf.range(3), tf.float32)
...     return [rows_alike(t) for t in (tf.tile(mask[None], [3, 1, 1]), mask,
...                                     tf.repeat(mask[None], 3, axis=0) * 2.0, tf.ones([3, 3]))]
>>> [bool(v) for v in alike()]
[True, False, True, True]
"""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import row_layout

__all__ = ["mark_shared_call_args", "rows_alike"]

# Ops whose output is its inputs' elements combined position by position (inputs broadcast
# from their trailing axes): rows alike in every input make them alike in the output.
_ELEMENTWISE = frozenset({
    "Identity", "Cast", "StopGradient", "Neg", "LogicalNot", "Abs", "Sign", "Square", "Sqrt",
    "Rsqrt", "Exp", "Log", "Sigmoid", "Tanh", "Floor", "Ceil", "Reciprocal", "Add", "AddV2",
    "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "FloorDiv", "FloorMod", "Pow", "Maximum",
    "Minimum", "Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual",
    "LogicalAnd", "LogicalOr", "SelectV2"})
_MAX_DEPTH = 40  # ops walked up from an argument; deeper chains count as not alike
_MAX_CONSTANT = 1 << 20  # elements of a constant compared row by row


def rows_alike(tensor, axes=1, depth=0):
    """Whether ``tensor``'s values are the same along its first ``axes`` axes by
    construction (read off the traced ops; False when not shown)."""
    shape = tensor.shape
    if shape.rank is None or shape.rank < axes or depth > _MAX_DEPTH:
        return False
    if all(size == 1 for size in shape[:axes]):
        return True
    op = tensor.op
    if op.type in ("Fill", "ZerosLike", "OnesLike"):
        return True
    if op.type == "Const":
        return _constant_rows_alike(tf.get_static_value(tensor), axes)
    if op.type in ("Tile", "BroadcastTo"):
        source = op.inputs[0]
        new = shape.rank - (source.shape.rank or 0)  # BroadcastTo's leading new axes
        kept = [i - new for i in range(new, axes)]
        return source.shape.rank is not None and (
            all(source.shape[i] == 1 for i in kept)
            or (not kept or rows_alike(source, max(kept) + 1, depth + 1)))
    if op.type == "Reshape":
        return _reshape_rows_alike(op, axes, depth)
    if op.type == "ExpandDims":
        return rows_alike(op.inputs[0], axes - 1, depth + 1) if axes > 1 else _expanded_first(op)
    if op.type in _ELEMENTWISE:
        return all(_input_alike(t, shape.rank, axes, depth) for t in op.inputs)
    return False


def _constant_rows_alike(value, axes):
    if value is None or value.size > _MAX_CONSTANT:
        return False
    flat = value.reshape((-1,) + value.shape[axes:])
    return bool(np.all(flat == flat[:1]))


def _reshape_rows_alike(op, axes, depth):
    """A reshape keeps the first ``axes`` axes alike when they are a merge of leading input
    axes that are alike (tf.repeat: [1, n, ...] → [n, ...])."""
    source, out = op.inputs[0].shape, op.outputs[0].shape
    if not (source.is_fully_defined() and out.is_fully_defined()):
        return False
    target, merged = int(np.prod(out[:axes])), 1
    for count in range(source.rank + 1):
        if merged == target:
            return rows_alike(op.inputs[0], count, depth + 1)
        if count < source.rank:
            merged *= source[count]
    return False


def _expanded_first(op):
    """ExpandDims at axis 0 gives a first axis of 1 (alike); another axis, not shown."""
    axis = tf.get_static_value(op.inputs[1])
    return axis is not None and int(np.reshape(axis, [])) == 0


def _input_alike(tensor, rank, axes, depth):
    """An elementwise op's input, broadcast from the trailing axes to ``rank`` axes."""
    if tensor.shape.rank is None:
        return False
    lead = rank - tensor.shape.rank  # axes the broadcast adds in front: alike
    own = [i - lead for i in range(max(lead, 0), axes)]
    return not own or rows_alike(tensor, max(own) + 1, depth + 1)


def mark_shared_call_args(records, walked):
    """Sets ``record.shared_args`` (leaf indices of its call's arguments, module docstring)
    for the records whose handler passes arguments by their first axis. ``walked``: the
    (sources, layouts) of example_rows.refuse_calls_off_the_batch, or None (no traced batch
    to walk from: nothing is marked)."""
    if walked is None:
        return
    sources, layouts = walked
    graph = next(iter(sources)).graph
    for record in records:
        rows = tf.nest.flatten(record.inputs)[0].shape[0]
        if record.handler.slices_call_args or rows is None:
            continue  # slices every tensor argument (a recurrent layer's states and mask)
        leaves = tf.nest.flatten((record.call_args, record.call_kwargs))
        record.shared_args = frozenset(
            i for i, t in enumerate(leaves)
            if isinstance(t, tf.Tensor) and getattr(t, "graph", None) is graph
            and t.shape.rank and t.shape[0] == rows
            and row_layout.batch_axis(t, sources, layouts) is None and not rows_alike(t))
