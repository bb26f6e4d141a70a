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
"""The layouts row_layout's walk gives tensors — an axis, or a mark: REARRANGED, MIXED,
UNKNOWN, rows PICKED by an index; None: no dependence on the batch — how the layouts of an
op's inputs combine (one_layout, same_axes), and the static values the rules read.

>>> one_layout([0, None, PICKED]), one_layout([REARRANGED, None]), one_layout([1, 1])
(MIXED, REARRANGED, 1)
"""

import contextlib
import contextvars

import numpy as np

from tf_tempered._compat import tf

__all__ = ["BATCH_ROWS", "ROWS_TO_CHECK", "MIXED", "PICKED", "REARRANGED", "UNKNOWN", "KeyedMark",
           "Mark", "Picked",
           "NOT_CHECKABLE", "batch_length", "batch_rows", "check_rows_later", "first_length",
           "rows_setting_for_a_function",
           "is_picked", "normalized_axis", "one_layout", "outer_of", "picked_at", "position_in",
           "range_limit", "same_axes", "source_of", "static_at", "static_values"]


class Mark:
    """A layout that is not an axis (its name is its repr)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


REARRANGED = Mark("REARRANGED")
MIXED = Mark("MIXED")
UNKNOWN = Mark("UNKNOWN")


class KeyedMark(Mark):
    """A mark with a key: two of one kind are the same layout when their keys are equal."""

    def __init__(self, name, key):
        super().__init__(name)
        self.key = key

    def __eq__(self, other):
        return type(other) is type(self) and other.key == self.key

    def __hash__(self):
        return hash((type(self), self.key))


class Picked(KeyedMark):
    """Rows of one (or some) of the batch's examples, picked by an index: x[0],
    tf.unstack(x)[i], a loop's x[i]. ``keys``: which ones (static indices, or the tensors
    holding them); none known: any. Combined with the batch's rows, or with rows picked by
    another index, examples see each other's data: MIXED."""

    def __init__(self, keys=()):
        super().__init__("PICKED", frozenset(keys))
        self.keys = self.key


PICKED = Picked()


def is_picked(layout):
    return isinstance(layout, Picked)


def picked_at(vector, index=None):
    """The rows picked by element ``index`` of ``vector`` (a slice's begin; ``index`` None:
    ``vector`` is the index), keyed by its static value or the tensor holding it."""
    try:
        value = static_values(vector)
        return Picked({("index", value[0 if index is None else index])})
    except (TypeError, ValueError, IndexError):
        pass
    if index is not None and vector.op.type == "Pack":
        vector, index = vector.op.inputs[index], None
    vector = outer_of(vector)
    return Picked({("tensor", id(vector.graph), vector.name, index)})


def position_in(tensor, tensors):
    """The index of ``tensor`` itself (not an equal value: tensors compare elementwise) in
    ``tensors``, or None."""
    return next((i for i, t in enumerate(tensors) if t is tensor), None)


def outer_of(tensor):
    """The tensor of an enclosing graph that ``tensor`` stands for when it is a function's
    placeholder for a value it captured (a tf.cond branch's copy of tf.map_fn's position):
    rows picked by either are the same rows. ``tensor`` itself otherwise."""
    while tensor.op.type == "Placeholder":
        graph = tensor.graph
        inside = list(getattr(graph, "internal_captures", None) or ())
        position = position_in(tensor, inside)
        if position is None:
            break
        tensor = list(graph.external_captures)[position]
    return tensor


# The walk's memo key of the batch's static length (None: unknown while tracing), which the
# rules read through batch_rows() while batch_axis walks (row_layout_ops._reshape).
BATCH_ROWS = "the batch's static length"
# The walk's memo key of a list that, with the batch's length unknown, collects (tensor, axis)
# of the reshapes whose rows hold whole examples only if that axis's length is a multiple of
# the batch's, for a check when the step runs (row_layout_ops._reshape).
ROWS_TO_CHECK = "reshaped rows to check when the step runs"
_BATCH_ROWS = contextvars.ContextVar("tf_tempered_batch_rows", default=(None, None))


def batch_rows():
    """The batch's static length in the walk under way, or None."""
    return _BATCH_ROWS.get()[0]


# ROWS_TO_CHECK in a function's graph (a tf.cond branch, a loop's body, a nested tf.function):
# a check of its tensors cannot run in the step's graph.
NOT_CHECKABLE = "rows a check in the step's graph cannot read"


def check_rows_later(tensor, axis):
    """With the batch's length unknown while tracing: ``tensor``'s ``axis`` (a reshape's
    example rows) is to hold a multiple of the batch's length, checked when the step runs,
    if the walk under way collects such checks. False when it cannot be (in a function's
    graph: the caller takes the rows as rearranged; probe P3, F1)."""
    to_check = _BATCH_ROWS.get()[1]
    if to_check is NOT_CHECKABLE:
        return False
    if to_check is not None and not any(t is tensor for t, _ in to_check):
        to_check.append((tensor, axis))
    return True


def rows_setting_for_a_function():
    """(BATCH_ROWS, ROWS_TO_CHECK) for the walk of a function's graph inside the walk under
    way: the same batch length (a merged-rows reshape in a tf.function method went unseen
    with it known), and reshapes not checkable later if the outer walk collects checks."""
    rows, to_check = _BATCH_ROWS.get()
    return rows, (NOT_CHECKABLE if to_check is not None else None)


@contextlib.contextmanager
def batch_length(rows, rows_to_check=None):
    """Within it, batch_rows() is ``rows`` and check_rows_later appends to
    ``rows_to_check`` (a list, or None: not collected)."""
    token = _BATCH_ROWS.set((rows, rows_to_check))
    try:
        yield
    finally:
        _BATCH_ROWS.reset(token)


def one_layout(layouts):
    """The one layout of the batch-dependent inputs: MIXED for picked rows with the batch's
    (t - t[0]) or with rows picked by another index (a loop's t[i] - t[i - 1]), and for
    rearranged rows with the batch's (a loss of each label and a reversed prediction),
    REARRANGED if one is, the picked rows if any, else UNKNOWN when they disagree."""
    found = {layout for layout in layouts if layout is not None}
    picks = {layout.keys for layout in found if is_picked(layout)} - {frozenset()}
    if any(is_picked(f) for f in found) and (
            REARRANGED in found or any(isinstance(f, int) for f in found) or len(picks) > 1):
        return MIXED
    if REARRANGED in found and any(isinstance(f, int) for f in found):
        return MIXED  # rows moved across examples, combined with the batch's rows in place
    if REARRANGED in found:
        return REARRANGED
    if any(is_picked(f) for f in found):
        return Picked(picks.pop()) if picks else PICKED
    return found.pop() if len(found) == 1 else UNKNOWN


def same_axes(op, layouts):
    """Elementwise ops, matmuls, convolutions, reductions over other axes, ...: the axis
    is kept when the output's rank is that of every batch-dependent input (picked rows stay
    picked, whatever is reduced)."""
    layout = one_layout(layouts)
    if not isinstance(layout, int) or not op.outputs:
        return layout
    ranks = {t.shape.rank for t, found in zip(op.inputs, layouts) if found is not None}
    return layout if ranks == {op.outputs[0].shape.rank} != {None} else UNKNOWN


def source_of(tensor, through=("Identity", "Cast")):
    """The tensor ``tensor`` copies: its first input's, through ops of the types ``through``
    (identities and casts, which move no row)."""
    while tensor.op.type in through and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def static_values(tensor):
    """The ints of a static tensor, also one TF's constant folding leaves (tf.nn.softmax's
    permutation: a concat of ranges and a stack of differences of constants); ValueError
    when not static."""
    value = tf.get_static_value(tensor)
    if value is None:
        value = _folded(tensor)
    return [int(v) for v in tf.nest.flatten(np.asarray(value).tolist())]


# The integer ops _folded evaluates, on static inputs.
_FOLDED = {"Sub": np.subtract, "AddV2": np.add, "Add": np.add, "Mul": np.multiply,
           "Neg": np.negative, "Identity": lambda v: v, "Cast": lambda v: v}


def _folded(tensor, depth=0):
    """``tensor``'s value from constants through small integer ops (a range, a stack, a
    concat and arithmetic); ValueError if it needs anything else."""
    value = tf.get_static_value(tensor)
    if value is not None:
        return np.asarray(value)
    op = tensor.op
    if depth > 16 or op.type not in (*_FOLDED, "Range", "Pack", "ConcatV2"):
        raise ValueError("not static")
    inputs = [_folded(t, depth + 1) for t in op.inputs]
    if op.type == "Range":
        return np.arange(*(int(v) for v in inputs))
    if op.type == "Pack":
        return np.stack(inputs, axis=op.get_attr("axis"))
    if op.type == "ConcatV2":
        return np.concatenate(inputs[:-1], axis=int(inputs[-1]))
    return _FOLDED[op.type](*inputs)


def static_at(tensor, index):
    """Element ``index`` of a static vector, also of a tf.stack of scalars some of which
    are not static (tf.repeat's multiples), or of a tf.concat whose part holding it is
    static (TF's batch_dims gather_nd tiles by [1, <a shape's slice>, 1])."""
    if tf.get_static_value(tensor) is None:
        if tensor.op.type == "Pack":
            return static_values(tensor.op.inputs[index])[0]
        if tensor.op.type == "ConcatV2":
            for part in tensor.op.inputs[:-1]:
                length = part.shape.num_elements()
                if length is None:
                    break
                if index < length:
                    return static_values(part)[index]
                index -= length
    return static_values(tensor)[index]


def first_length(tensor):
    """What ``tensor`` measures when it is the length of a tensor x's first axis:
    ``tf.shape(x)[0]`` (or ``tf.unstack(tf.shape(x)[:k])[0]``, TF's batch_dims gather_nd),
    through identities and casts: (x, None); (None, n) when TF knew the shape while tracing
    (a constant n); None when it is not such a length.

    >>> @tf.function(input_signature=[tf.TensorSpec([None, 3])])
    ... def lengths(x):
    ...     found.extend([first_length(tf.shape(x)[0])[0] is x,
    ...                   first_length(tf.unstack(tf.shape(x)[:1])[0])[0] is x,
    ...                   first_length(tf.shape(x)[1]), first_length(tf.shape(x * 2)[0])[0] is x,
    ...                   first_length(tf.shape(tf.ones([5, 3]))[0])])
    >>> found = []
    >>> _ = lengths.get_concrete_function()
    >>> found
    [True, True, None, False, (None, 5)]
    """
    tensor = source_of(tensor)
    op = tensor.op
    try:
        if op.type == "Unpack" and tensor.value_index == 0 and op.get_attr("axis") == 0:
            op, shrunk = op.inputs[0].op, False  # the first of a shape's leading lengths
        else:
            shrunk = True
        if (op.type != "StridedSlice" or op.inputs[0].op.type not in ("Shape", "Const")
                or static_values(op.inputs[1]) != [0] or set(static_values(op.inputs[3])) != {1}
                or op.get_attr("shrink_axis_mask") != int(shrunk)
                or op.get_attr("ellipsis_mask") or op.get_attr("new_axis_mask")):
            return None
        if op.inputs[0].op.type == "Const":
            return None, static_values(op.inputs[0])[0]
    except (ValueError, IndexError):
        return None
    return op.inputs[0].op.inputs[0], None


def normalized_axis(value, rank):
    return value + rank if value < 0 else value


def range_limit(tensor):
    """The limit n when ``tensor`` is tf.range(0, n, 1) (through identities and casts),
    else None.

    >>> found = []
    >>> @tf.function
    ... def ranges(n):
    ...     found.extend(range_limit(t) is not None for t in (
    ...         tf.range(n), tf.cast(tf.range(0, n, 1), tf.float32), tf.range(1, n),
    ...         tf.range(0, n, 2)))
    >>> ranges(tf.constant(4))
    >>> found
    [True, True, False, False]
    """
    op = source_of(tensor).op
    try:
        if op.type == "Range" and static_values(op.inputs[0]) == [0] \
                and static_values(op.inputs[2]) == [1]:
            return op.inputs[1]
    except ValueError:
        pass
    return None
