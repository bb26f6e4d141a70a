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
* ``PICKED``: one (or some) example's rows taken by an index (``t[0]``, a loop's ``t[i]``,
  ``tf.unstack(t)[i]``): MIXED once used with the batch's rows (``t - t[0]``), and in a
  loop that carries them from one iteration to the next (a running total); stacked again
  by static indices, the batch's axis in order, REARRANGED in another; each written back at
  the index that picked it and stacked (``tf.map_fn``'s results), the batch's axis (MIXED
  when one position is: :mod:`tf_tempered.privacy.row_layout_lists`);
* None: no dependence on the batch (its length aside); ``UNKNOWN``: an op this walk does
  not follow: nothing is claimed.

Loops, conds and nested tf.functions are followed into their graphs
(:mod:`tf_tempered.privacy.row_layout_functions`), TensorLists (tf.TensorArray,
:mod:`tf_tempered.privacy.row_layout_lists`), slices
(:mod:`tf_tempered.privacy.row_layout_slices`), gather_nd and scatters
(:mod:`tf_tempered.privacy.row_layout_nd`), rows a mask kept put back at its positions
(:mod:`tf_tempered.privacy.row_layout_masks`), ops that add, drop or move an example's axes
(:mod:`tf_tempered.privacy.row_layout_axes`: one-hot, depth-to-space, diagonals), a dilated
convolution's blocks of the batch (:mod:`tf_tempered.privacy.row_layout_blocks`). The marks,
and how an op's inputs' layouts combine, are :mod:`tf_tempered.privacy.row_layout_marks`;
the other ops' rules :mod:`tf_tempered.privacy.row_layout_ops`.

Nothing puts rearranged rows back in order for the walk: a split, unstack or gather keeps
``REARRANGED`` along any axis (rolled rows gathered along the features are still rolled; a
concatenation's halves split again, or a reversal gathered back in order, are refused on the
safe side: which rows come back is not checked), as do reshapes and slices (a Flatten after a
concatenation, a slice of shifted rows). Nothing unmixes: ``MIXED`` stays.

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
...         tf.matmul(a[:, 0], a[:, 0], transpose_b=True), tf.math.cumsum(a[:, -1], axis=0),
...         a[0], a - a[0], tf.stack([row * 2 for row in tf.unstack(a)]), tf.linalg.qr(a[:, 0])[0]))
>>> mixed(tf.ones((2, 4, 3)))
>>> found
[MIXED, 0, 0, MIXED, MIXED, MIXED, PICKED, MIXED, 0, MIXED]
"""

from tf_tempered.privacy import (row_layout_axes, row_layout_blocks, row_layout_functions,
                                 row_layout_lists, row_layout_masks, row_layout_mixing,
                                 row_layout_nd, row_layout_ops, row_layout_slices)
from tf_tempered.privacy.row_layout_marks import (BATCH_ROWS, MIXED, PICKED, REARRANGED,
                                                  ROWS_TO_CHECK, UNKNOWN, batch_length,
                                                  is_picked, rows_setting_for_a_function,
                                                  same_axes, source_of)

__all__ = ["BATCH_ROWS", "MIXED", "PICKED", "REARRANGED", "ROWS_TO_CHECK", "SHAPE_ONLY", "UNKNOWN",
           "batch_axis",
           "is_picked", "is_rearranged", "source_of"]

# Ops that read a tensor's shape, not its values: a length is no data of the batch.
SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank"}) | row_layout_lists.SHAPE_ONLY
_RULES = {**row_layout_ops.RULES, **row_layout_slices.RULES, **row_layout_nd.RULES,
          **row_layout_mixing.RULES, **row_layout_lists.RULES, **row_layout_axes.RULES,
          **row_layout_blocks.RULES}
# Ops whose output's length is decided by values: a shape read after them is a count of the
# batch's data (tf.shape(tf.where(y > 0))[0], the positives of the batch).
_LENGTH_FROM_VALUES = frozenset({"Where", "Unique", "UniqueV2", "UniqueWithCounts",
                                 "UniqueWithCountsV2", "ListDiff", "SetSize"})


def is_rearranged(layout):
    """Whether ``layout`` holds the batch's rows out of example-major order (REARRANGED, or
    a dilated convolution's blocks of the batch)."""
    return layout is REARRANGED or row_layout_blocks.is_blocked(layout)


def batch_axis(tensor, sources, memo=None):
    """The layout of ``tensor`` (module docstring); ``sources``: ops whose outputs hold the
    examples on axis 0; ``memo``: op -> layout, shared between calls on one graph (and at
    ``BATCH_ROWS``, the batch's static length, if known; at ``ROWS_TO_CHECK``, a list that
    collects the reshapes to check when the step runs, if the length is not known)."""
    memo = {} if memo is None else memo
    with batch_length(memo.get(BATCH_ROWS), memo.get(ROWS_TO_CHECK)):
        return _walk(tensor, sources, memo)


def _walk(tensor, sources, memo):
    counted = memo.setdefault(_COUNTED, set())
    stack = [(tensor.op, False)]
    while stack:
        op, expanded = stack.pop()
        if op in memo:
            continue
        if op in sources:
            memo[op] = 0
        elif expanded:
            parents = [t.op for t in op.inputs]
            layouts = [_layout_of(t, memo) for t in op.inputs]
            if op.type in row_layout_functions.FUNCTIONAL and op.outputs:
                outputs = row_layout_functions.output_layouts(op, layouts, _walk_in_function)
                memo[(_PER_OUTPUT, op)] = outputs
                memo[op] = row_layout_functions.join(outputs)
            elif memo.get(_IN_FUNCTION) and all(
                    layout is None or layout is UNKNOWN for layout in layouts) and any(layouts):
                # In a function's graph (a loop's body: tf.map_fn's, vectorized_map's
                # fallback), rows read by an index are UNKNOWN; a reduction of one is
                # one example's, not a mix: nothing is claimed.
                memo[op] = UNKNOWN
            else:
                memo[op] = _follow(op, layouts, counted)
                if memo[op] is row_layout_masks.PUT_BACK:
                    memo[op] = row_layout_masks.resolve(op, memo, batch_axis)
                elif memo[op] is row_layout_lists.STACKED_PICKS:
                    memo[op] = row_layout_lists.resolve_stack(
                        op, lambda t: _layout_of(t, memo) if t.op in memo else None)
                if isinstance(memo[op], list):  # one layout per output (unstack, split)
                    memo[(_PER_OUTPUT, op)] = memo[op]
                    memo[op] = row_layout_functions.join(memo[op])
            if memo[op] is not None and (op.type in _LENGTH_FROM_VALUES
                                         or any(parent in counted for parent in parents)):
                counted.add(op)
        else:
            stack.append((op, True))
            stack.extend((t.op, False) for t in op.inputs if t.op not in memo)
    return _layout_of(tensor, memo)


def _layout_of(tensor, memo):
    """The layout of one tensor: its op's, or that output's of a functional op."""
    per_output = memo.get((_PER_OUTPUT, tensor.op))
    return memo[tensor.op] if per_output is None else per_output[tensor.value_index]


def _walk_in_function(tensor, memo):
    """A tensor's layout in a function's graph whose inputs' layouts ``memo`` holds."""
    memo[_IN_FUNCTION] = True
    rows, to_check = rows_setting_for_a_function()
    memo.setdefault(BATCH_ROWS, rows)
    memo.setdefault(ROWS_TO_CHECK, to_check)
    return batch_axis(tensor, frozenset(), memo)


# The memo's entry holding the ops whose shape the batch's values may have decided (an op of
# _LENGTH_FROM_VALUES on batch data among their ancestors).
_COUNTED = "ops whose length counts batch data"
# The memo's flag: the graph walked is a function's (a loop's body, a branch, a call).
_IN_FUNCTION = "in a function's graph"
# The memo's key prefix for a functional op's list of layouts, one per output.
_PER_OUTPUT = "layouts per output"


# Inputs that set an op's output length, not its values: tf.math.bincount's number of bins
# (Keras' CategoryEncoding: max(minlength, the batch's largest id + 1), clipped to maxlength).
_LENGTH_INPUTS = {"DenseBincount": 1, "Bincount": 1}


def _follow(op, layouts, counted):
    if op.type in _LENGTH_INPUTS:
        layouts = [None if i == _LENGTH_INPUTS[op.type] else layout
                   for i, layout in enumerate(layouts)]
    if all(layout is None for layout in layouts):
        return None
    if op.type in SHAPE_ONLY:  # only the batch's length, unless values decided a length
        return MIXED if op.inputs[0].op in counted else None
    if MIXED in layouts:
        return MIXED  # nothing unmixes
    if any(row_layout_blocks.is_blocked(layout) for layout in layouts):
        return row_layout_blocks.follow_blocked(op, layouts)
    rule = _RULES.get(op.type, same_axes)
    try:
        return rule(op, layouts)
    except (TypeError, ValueError, IndexError):  # a static value or shape not known
        return UNKNOWN


