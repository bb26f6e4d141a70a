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
"""Row layouts through TF's functional ops: ``tf.while_loop``, ``tf.cond`` and a nested
``tf.function`` (one layout per output).

Each op runs graphs of its own (a loop's body and condition, a cond's two branches, a
called function), whose inputs are the op's inputs: the walk follows the batch's axis into
them from the layouts of those inputs, and out through their outputs.

* A call: its function's outputs.
* A cond: each branch's outputs, joined; MIXED when the predicate is computed from several
  examples (one branch chosen for every example by all of them).
* A loop: the body's outputs joined with its inputs until they stop changing (a loop
  variable may hold either after some iterations); MIXED when the condition is computed
  from several examples (how many iterations every example gets, decided by all of them),
  or when a variable carries rows picked in one iteration to the next (a running total
  over the examples: ``acc + x[i]``, ``tf.scan``); rows picked before the loop count as
  UNKNOWN in its body (an example's own recurrence, inside ``tf.map_fn``'s body).
  A predicate this walk cannot follow (in ``tf.map_fn``'s body, one example's row) makes
  the outputs UNKNOWN, not MIXED.

Join: MIXED if any is, else REARRANGED, else PICKED, else the one axis, UNKNOWN if several.
A graph that cannot be read (no function of that name in the graph) is UNKNOWN.

>>> import tensorflow as tf
>>> from tf_tempered.privacy import row_layout
>>> found = []
>>> @tf.function
... def layouts(a):
...     def centred(t):
...         return t - tf.reduce_mean(t, axis=0)
...     loop = tf.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, t * 2), [0, a])[1]
...     mixing_loop = tf.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, centred(t)), [0, a])
...     cond = tf.cond(tf.shape(a)[0] > 1, lambda: a * 2, lambda: a)
...     found.extend(row_layout.batch_axis(t, {a.op}) for t in (
...         loop, mixing_loop[0], mixing_loop[1], cond, tf.function(centred)(a),
...         tf.cond(tf.reduce_sum(a) > 0, lambda: a * 2, lambda: a),
...         tf.cond(a[0, 0] > 0, lambda: a * 2, lambda: a),
...         tf.function(lambda t: tf.reverse(t, [0]))(a),
...         tf.while_loop(lambda i, s: i < 2, lambda i, s: (i + 1, s + a[i, 0]), [0, 0.0])[1]))
>>> layouts(tf.ones((2, 3)))
>>> found
[0, None, MIXED, 0, MIXED, MIXED, MIXED, REARRANGED, MIXED]
"""

from tf_tempered.privacy.row_layout_marks import (MIXED, PICKED, REARRANGED, UNKNOWN, Picked,
                                                  is_picked, one_layout)

__all__ = ["FUNCTIONAL", "function_graph", "function_graphs", "join", "output_layouts"]

FUNCTIONAL = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase",
                        "PartitionedCall", "StatefulPartitionedCall"})
_MAX_LOOP_ROUNDS = 8  # a join only climbs: None < an axis < UNKNOWN < PICKED < REARRANGED < MIXED


def join(layouts):
    """The layout a tensor has when it may be any of ``layouts`` (module docstring)."""
    found = {layout for layout in layouts if layout is not None}
    for mark in (MIXED, REARRANGED):
        if mark in found:
            return mark
    picks = [layout for layout in found if is_picked(layout)]
    if picks:  # rows picked by any of these indices
        keys = [pick.keys for pick in picks]
        return PICKED if frozenset() in keys else Picked(frozenset().union(*keys))
    if not found:
        return None
    return found.pop() if len(found) == 1 else UNKNOWN


def output_layouts(op, layouts, walk):
    """[the layout of each of ``op``'s outputs] (a functional op), from ``layouts``, its
    inputs' layouts; ``walk(tensor, memo)``: the layout of a tensor of another graph, with
    ``memo`` holding its inputs' layouts."""
    if op.type in ("While", "StatelessWhile"):
        found = _loop(op, layouts, walk)
    elif op.type in ("If", "StatelessIf", "Case", "StatelessCase"):
        found = _cond(op, layouts, walk)
    else:
        found = _through(function_graph(op, "f"), layouts, walk)
    if found is None or len(found) != len(op.outputs):
        return [UNKNOWN] * len(op.outputs)
    return found


def function_graph(op, attribute):
    """The graph of ``op``'s function attribute ``attribute`` (a loop's body, a branch), or
    None when the graph does not hold it."""
    try:
        return _graph_named(op, op.get_attr(attribute).name)
    except (AttributeError, ValueError, TypeError):
        return None


def function_graphs(op):
    """The graphs of every function ``op`` runs, in its attributes' order (a tf.switch_case's
    list of branches among them), None for one the graph does not hold."""
    attrs = op.node_def.attr
    names = []
    for name in sorted(attrs):
        names += ([attrs[name].func.name] if attrs[name].HasField("func")
                  else [function.name for function in attrs[name].list.func])
    return [_graph_named(op, name) for name in names]


def _graph_named(op, name):
    try:
        return op.graph._get_function(name).graph  # pylint: disable=protected-access
    except (AttributeError, KeyError, ValueError, TypeError):
        return None


def _through(graph, layouts, walk):
    """The layouts of ``graph``'s outputs when its inputs have ``layouts``, or None."""
    if graph is None or len(graph.inputs) != len(layouts):
        return None
    memo = {placeholder.op: layout for placeholder, layout in zip(graph.inputs, layouts)}
    return [walk(output, memo) for output in graph.outputs]


def _cond(op, layouts, walk):
    """tf.cond (then and else branches) and tf.switch_case (a list of branches)."""
    if op.type in ("Case", "StatelessCase"):
        graphs = [_graph_named(op, branch.name) for branch in op.get_attr("branches")]
    else:
        graphs = [function_graph(op, name) for name in ("then_branch", "else_branch")]
    branches = [_through(graph, layouts[1:], walk) for graph in graphs]
    if any(found is None or len(found) != len(op.outputs) for found in branches):
        return None
    return _decided_by(layouts[0], [join(pair) for pair in zip(*branches)])


def _loop(op, layouts, walk):
    body, condition = function_graph(op, "body"), function_graph(op, "cond")
    # Rows picked by the same index in every iteration (a static one, t[0]; or one of an
    # enclosing graph: tf.map_fn's row read by a time loop in its body) stay those rows.
    state = [layout if _same_rows_in_every_iteration(layout, body)
             else UNKNOWN if is_picked(layout) else layout for layout in layouts]
    for _ in range(_MAX_LOOP_ROUNDS):
        found = _through(body, state, walk)
        if found is None or len(found) != len(state):
            return None
        if any(is_picked(f) and not _same_rows_in_every_iteration(f, body) for f in found):
            return [MIXED] * len(state)  # rows picked in one iteration, carried to the next
        joined = [join(pair) for pair in zip(state, found)]
        if joined == state:
            break
        state = joined
    else:
        return None
    # The condition sees rows picked before the loop as picked: a count of iterations read
    # from one example's value decides for every example's rows.
    seen = [original if is_picked(original) and now is UNKNOWN else now
            for original, now in zip(layouts, state)]
    predicate = _through(condition, seen, walk)
    if predicate is None:
        return None
    return _decided_by(join(predicate), state)


def _same_rows_in_every_iteration(layout, body):
    """Rows picked by static indices, or by tensors of graphs enclosing the loop's ``body``
    (an enclosing loop's position, captured): the same rows in every iteration. (Not by a
    tensor of the body, or of a function or branch inside it.)"""
    if not is_picked(layout) or not layout.keys or body is None:
        return False
    enclosing, graph = set(), getattr(body, "outer_graph", None)
    while graph is not None:
        enclosing.add(id(graph))
        graph = getattr(graph, "outer_graph", None)
    return all(key[0] in ("index", "part") or key[0] == "tensor" and key[1] in enclosing
               for key in layout.keys)


def _decided_by(predicate, layouts):
    """``layouts`` of the outputs of a cond or loop whose predicate has layout ``predicate``:
    MIXED if computed from several examples (a scalar from the whole batch); from one
    example's picked rows, those rows used with each output (MIXED for the batch's rows:
    ``tf.cond(x[0, 0] > 0, ...)`` decides for every example; one example's own output in
    ``tf.map_fn``'s body); nothing claimed if not followed."""
    if predicate is None:
        return layouts
    if predicate is MIXED or predicate is REARRANGED:  # one value for every example
        return [MIXED] * len(layouts)
    if is_picked(predicate):
        return [MIXED if layout is MIXED else one_layout([predicate, layout])
                for layout in layouts]
    return [join([layout, UNKNOWN]) for layout in layouts]
