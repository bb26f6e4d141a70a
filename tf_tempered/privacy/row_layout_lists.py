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
"""How TensorList ops (a tf.TensorArray, the lists behind tf.map_fn, tf.scan and Keras'
recurrent loops) move the batch's axis: rules of row_layout's walk.

A list's layout is that of the tensor it stacks to: ``TensorListFromTensor(x)`` of x with
the examples on axis 1 (time-major steps) holds them on axis 0 of each item; a list of the
examples themselves (axis 0, tf.map_fn's) gives one example's rows per item, PICKED (by the
index read). Items of picked rows written back (tf.map_fn's per-example results) make a list
of picks: read back at another index, they are that index's rows (a running total kept in
the list, ``ta.read(i - 1) + t[i]``, mixes two examples); stacked, they are the batch's rows
when the loop's list has an item for each example (tf.map_fn over the batch, or over
``tf.range`` of its length: resolve_stack), else MIXED (some examples' rows). A list made from
``tf.range(n)`` and read in a loop gives each iteration its own position (tf.map_fn over
positions: rows gathered at it are that example's); TensorArray gathers and scatters keep
the batch in order, and rearrange it in another.

>>> import tensorflow as tf
>>> from tf_tempered.privacy import row_layout
>>> found = []
>>> @tf.function
... def lists(a):
...     steps = tf.TensorArray(tf.float32, size=3).unstack(tf.transpose(a, [1, 0, 2]))
...     found.extend(row_layout.batch_axis(t, {a.op}) for t in (
...         steps.read(0), tf.TensorArray(tf.float32, size=2).unstack(a).read(0),
...         tf.TensorArray(tf.float32, size=3).write(0, a[:, 0]).stack()))
>>> lists(tf.ones((2, 3, 4)))
>>> found
[0, PICKED, 1]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout_functions import function_graph
from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, UNKNOWN, Mark,
                                                  first_length, is_picked, picked_at,
                                                  position_in, range_limit, source_of,
                                                  static_values)

__all__ = ["LISTED_PICKS", "RULES", "SHAPE_ONLY", "STACKED_PICKS", "resolve_stack"]

# A list whose items are rows picked by their index (tf.map_fn's results, a loop writing each
# example's row): read back, an item is the rows picked by the index it is read at.
LISTED_PICKS = Mark("LISTED_PICKS")

# A stack of LISTED_PICKS: the walk resolves it (resolve_stack), with the layouts of the
# loop's inputs.
STACKED_PICKS = Mark("STACKED_PICKS")

# List ops that read a list's length or its items' shape, not their values.
SHAPE_ONLY = frozenset({"TensorListLength", "TensorListElementShape"})


def _from_tensor(op, layouts):
    return layouts[0]


def _stack(op, layouts):
    return STACKED_PICKS if layouts[0] is LISTED_PICKS else layouts[0]


def resolve_stack(op, layout_of):
    """The layout of a stack of rows each picked and written at its own index (tf.map_fn's
    results): the batch's axis when the loop's list was reserved with an item for each of the
    batch's examples (its length tf.shape(x)[0] of a tensor x holding them on axis 0, or of a
    tf.range over that length; tf.map_fn's over the batch itself), or grown by a loop writing
    at its counter from 0 by 1 while below such a length (_writes_each_example); MIXED for
    any other length (some examples' rows). ``layout_of``: the walk's layout of a tensor, None
    when not reached."""
    listed = source_of(op.inputs[0])
    loop = listed.op
    if loop.type not in ("While", "StatelessWhile"):
        return UNKNOWN
    reserved = source_of(loop.inputs[listed.value_index])
    if reserved.op.type != "TensorListReserve":
        return UNKNOWN
    length = reserved.op.inputs[1]
    if _counts_the_batch(length, loop, layout_of):
        return 0
    value = tf.get_static_value(length)
    if value is not None and value <= 0:  # a list that grows as the loop writes (dynamic_size)
        return 0 if _writes_each_example(loop, listed.value_index, layout_of) else MIXED
    # Some examples' rows (t - tf.map_fn(f, tf.range(1)) broadcasts one; repeated, a
    # shorter stack lines up with the batch's rows): MIXED.
    return MIXED


def _writes_each_example(loop, list_input, layout_of):
    """Whether a while loop grows its list (input ``list_input``) by one item per iteration
    at its counter, which counts from 0 by 1 while below the batch's length (``i < n`` in
    the condition: a tf.while_loop over the examples, AutoGraph's ``for i in
    tf.range(n)``)."""
    condition, body = function_graph(loop, "cond"), function_graph(loop, "body")
    if condition is None or body is None or len(body.outputs) != len(loop.inputs):
        return False
    test = source_of(condition.outputs[0], ("Identity",)).op
    if test.type != "Less":
        return False
    counter, limit = (source_of(t, ("Identity",)) for t in test.inputs)
    k, m = position_in(counter, condition.inputs), position_in(limit, condition.inputs)
    if k is None:
        return False
    if m is not None:  # a loop variable: the same in every iteration (a shrinking one is not)
        if source_of(body.outputs[m], ("Identity",)) is not body.inputs[m]:
            return False
        limit = loop.inputs[m]
    write = source_of(body.outputs[list_input], ("Identity",)).op
    return (_static_is(loop.inputs[k], 0) and _steps_by_one(body, k, loop)
            and write.type == "TensorListSetItem" and write.inputs[0] is body.inputs[list_input]
            and source_of(write.inputs[1]) is body.inputs[k]
            and _counts_the_batch(limit, loop, layout_of))


def _steps_by_one(body, k, loop):
    """Whether the loop's body returns its input ``k`` plus a static 1 (or plus a loop input
    that is 1: AutoGraph's range delta)."""
    step = source_of(body.outputs[k], ("Identity",)).op
    if step.type not in ("AddV2", "Add") or step.inputs[0] is not body.inputs[k]:
        return False
    by = step.inputs[1]
    if position_in(by, body.inputs) is not None:
        by = loop.inputs[position_in(by, body.inputs)]
    return _static_is(by, 1)


def _static_is(tensor, value):
    found = tf.get_static_value(tensor)
    return found is not None and found.size == 1 and int(found) == value


def _counts_the_batch(length, loop, layout_of):
    length = source_of(length)
    value = tf.get_static_value(length)
    if value is None and first_length(length) is not None:
        measured, value = first_length(length)
        if measured is not None:  # tf.shape(x)[0]: of the batch, or of a range over its length
            measured = source_of(measured)
            if layout_of(measured) == 0:
                return True
            limit = range_limit(measured)
            return limit is not None and _counts_the_batch(limit, loop, layout_of)
    if value is None:
        return False
    # A static length (a batch of a static size): that of the batch's rows the loop reads
    # (the elements tf.map_fn unstacks, or a tensor it gathers from).
    for source in map(source_of, loop.inputs):
        if source.op.type == "TensorListFromTensor":
            source = source_of(source.op.inputs[0])
        if layout_of(source) == 0 and source.shape[:1].as_list() == [int(value)]:
            return True
    return False


def _get_item(op, layouts):
    listed, index = layouts[0], layouts[1]
    if index is not None:
        return UNKNOWN  # an item chosen by the batch's values
    if listed == 0 or listed is LISTED_PICKS:
        return picked_at(op.inputs[1])
    return listed - 1 if isinstance(listed, int) else listed


def _set_item(item_input):
    """SetItem (list, index, item) and PushBack (list, item)."""
    def rule(op, layouts):
        listed, item = layouts[0], layouts[item_input]
        if listed is REARRANGED:
            return REARRANGED  # moved rows stay moved, whatever is written over them
        if any(layout is not None for layout in layouts[1:item_input]):
            return UNKNOWN  # written where the batch's values say
        if item is None:
            return listed
        if is_picked(item):
            if item_input == 2 and not _written_where_read(item, op.inputs[1]):
                return REARRANGED  # ta.write(i, x[i + 1]): example i + 1's rows at i
            return LISTED_PICKS if listed is None or listed is LISTED_PICKS else UNKNOWN
        if not isinstance(item, int):
            return item
        return item + 1 if listed in (None, item + 1) else UNKNOWN
    return rule


def _written_where_read(item, index):
    """Whether picked rows are written at the index that picked them (or picked without a
    key), or picked by the position read at that index from a loop's list of positions in
    order (tf.map_fn over tf.range(n): each example's rows by its own position)."""
    index = source_of(index)
    own = picked_at(index).keys
    # Every index that may have picked them (rows picked in either branch of a tf.cond).
    return all(key in own or key[0] == "tensor" and key[1] == id(index.graph)
               and _position_read_at(key[2], index) for key in item.keys)


def _position_read_at(name, index):
    """Whether tensor ``name`` (a pick's key) is the item at ``index`` of a loop's list that
    was made, before the loop, from tf.range(0, n, 1): then it equals ``index``, the loop's
    own position."""
    graph = index.graph
    try:
        read = source_of(graph.get_tensor_by_name(name))
    except (KeyError, ValueError):
        return False
    if read.op.type != "TensorListGetItem" or source_of(read.op.inputs[1]) is not index:
        return False
    listed = read.op.inputs[0]
    if not _passed_on_unchanged(graph, listed):
        return False  # the list of positions rewritten in the loop
    outer = _loop_input(graph, listed)
    if outer is None or outer.op.type != "TensorListFromTensor":
        return False
    return range_limit(outer.op.inputs[0]) is not None


def _passed_on_unchanged(body, placeholder):
    """Whether a loop's body graph returns its input ``placeholder`` as it came."""
    inputs, outputs = list(getattr(body, "inputs", [])), list(getattr(body, "outputs", []))
    position = position_in(placeholder, inputs)
    return (position is not None and position < len(outputs)
            and source_of(outputs[position], ("Identity",)) is placeholder)


def _loop_input(graph, placeholder):
    """The tensor a While op gives its body graph ``graph`` for ``placeholder``, or None."""
    inputs = list(getattr(graph, "inputs", []))
    outer_graph = getattr(graph, "outer_graph", None)
    position = position_in(placeholder, inputs)
    if position is None or outer_graph is None:
        return None
    for op in outer_graph.get_operations():
        if op.type in ("While", "StatelessWhile"):
            try:
                if op.get_attr("body").name == graph.name:
                    return op.inputs[position]
            except (ValueError, AttributeError):
                continue
    return None


def _in_order(indices):
    try:
        values = static_values(indices)
    except ValueError:
        return False
    return values == list(range(len(values)))


def _gather(op, layouts):
    """TensorListGather (tf.TensorArray.gather): a list of the examples gathered in their
    order from the first is the batch again; in another order, REARRANGED."""
    listed, indices = layouts[0], layouts[1]
    if indices is not None or listed is LISTED_PICKS:
        return UNKNOWN
    if listed == 0:
        return 0 if _in_order(op.inputs[1]) else REARRANGED
    return listed


def _scatter(tensor_input):
    """TensorListScatterV2 (tensor, indices, ...) and TensorListScatterIntoExistingList
    (list, tensor, indices; tf.TensorArray.scatter): the examples listed at the indices
    given; in another order than theirs, REARRANGED."""
    def rule(op, layouts):
        tensor, indices = layouts[tensor_input], layouts[tensor_input + 1]
        if indices is not None or any(layout is not None for layout in layouts[:tensor_input]):
            return UNKNOWN
        if tensor == 0:
            return 0 if _in_order(op.inputs[tensor_input + 1]) else REARRANGED
        return tensor
    return rule


RULES = {"TensorListFromTensor": _from_tensor, "TensorListGetItem": _get_item,
         "TensorListSetItem": _set_item(2), "TensorListPushBack": _set_item(1),
         "TensorListStack": _stack, "TensorListGather": _gather,
         "TensorListScatterV2": _scatter(0), "TensorListScatter": _scatter(0),
         "TensorListScatterIntoExistingList": _scatter(1)}
