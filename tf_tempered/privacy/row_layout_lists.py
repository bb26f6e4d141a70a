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
the list, ``ta.read(i - 1) + t[i]``, mixes two examples); stacked, they claim nothing.

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

from tf_tempered.privacy.row_layout_ops import REARRANGED, UNKNOWN, _Mark, is_picked, picked_at

__all__ = ["LISTED_PICKS", "RULES", "SHAPE_ONLY"]

# A list whose items are rows picked by their index (tf.map_fn's results, a loop writing each
# example's row): read back, an item is the rows picked by the index it is read at.
LISTED_PICKS = _Mark("LISTED_PICKS")

# List ops that read a list's length or its items' shape, not their values.
SHAPE_ONLY = frozenset({"TensorListLength", "TensorListElementShape"})


def _from_tensor(op, layouts):
    return layouts[0]


def _stack(op, layouts):
    return UNKNOWN if layouts[0] is LISTED_PICKS else layouts[0]


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
    """Whether picked rows are written at the index that picked them, or at one not known
    (rows picked without a key, or by an index read from a list: tf.map_fn over
    tf.range's positions)."""
    while index.op.type == "Identity" and index.op.inputs:
        index = index.op.inputs[0]
    return (not item.keys or picked_at(index).keys == item.keys
            or any(key[0] == "tensor" and _read_from_a_list(key[2], index.graph)
                   for key in item.keys))


def _read_from_a_list(name, graph):
    try:
        op = graph.get_tensor_by_name(name).op
    except (KeyError, ValueError):
        return True
    while op.type in ("Identity", "Cast") and op.inputs:
        op = op.inputs[0].op
    return op.type == "TensorListGetItem"


RULES = {"TensorListFromTensor": _from_tensor, "TensorListGetItem": _get_item,
         "TensorListSetItem": _set_item(2), "TensorListPushBack": _set_item(1),
         "TensorListStack": _stack}
