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
"""Checks that clipped_sum="recompute"'s second forward pass computes what the first did.

The clip factors come from the first pass's gradients, the clipped sum from the second's:
if a layer's call does something else on its second call of a step (a Python counter or
flag), the sum is of other gradients than those clipped (89-254 C for one example; probes
H1, F2 and H4, F1). While tracing, the two passes' ops are compared (:func:`computation`,
:func:`same_ops_as_first`), function bodies and captured tensors included, and a forward pass
that writes a variable is refused (:func:`refuse_variable_writes`: the second pass would
read its own write); when the step runs, the two passes' losses are compared
(:func:`same_losses_as_first`).

>>> graph = tf.Graph()
>>> with graph.as_default():
...     x = tf.compat.v1.placeholder(tf.float32, [None, 3])
...     start = len(graph.get_operations())
...     y = tf.nn.relu(x * 2.0)
...     ops = graph.get_operations()[start:]
>>> [(step[1], step[3]) for step in computation(ops)]  # (type, inputs)
[('Const', ()), ('Mul', (('in', 0), ('op', 0, 0))), ('Relu', (('op', 1, 0),))]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.custom_gradients import ENGINE_SCOPE
from tf_tempered.privacy.row_layout_functions import function_graphs

__all__ = ["computation", "refuse_variable_writes", "same_losses_as_first", "same_ops_as_first"]


def same_ops_as_first(second, first):
    """Raises ValueError, while tracing, unless the :func:`computation` ``second`` (of the
    recomputed forward pass and loss) is ``first``'s: the same op types with the same
    attributes and constants, wired alike (inputs from outside each pass matched by order of
    first use). A
    layer whose Python does something else on its second call of a step (a counter that
    freezes it by tf.stop_gradient on its first calls, a factor it changes) may give the same
    losses with another gradient, which the values check cannot see: 93-254 C for one example
    (probe H4, F1). The engine's own identities (the first pass's norm hooks) are see-through.
    """
    for position, (a, b) in enumerate(zip(first, second)):
        if a[1:] != b[1:]:
            _refuse_other_ops(f"op {position} of the first pass is {_named(a[0])}, of the "
                              f"second {_named(b[0])}")
    shorter, longer = sorted((first, second), key=len)
    if len(longer) > len(shorter):
        _refuse_other_ops(f"one pass has {len(longer) - len(shorter)} more ops, from "
                          f"{_named(longer[len(shorter)][0])}")


# Ops writing a resource variable or a lookup table (a layer's counter, a statistic it
# keeps), besides the families ResourceScatter*, ResourceApply* and ResourceSparseApply*.
_WRITES = frozenset({"AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
                     "ResourceStridedSliceAssign", "LookupTableInsertV2",
                     "LookupTableImportV2", "LookupTableRemoveV2"})


def refuse_variable_writes(ops):
    """Raises ValueError if the traced forward pass ``ops`` writes a variable or a table, in
    the functions it runs too: the second pass would run the write again and read what the
    first wrote (a weight stepped each call, its factor read in the gradient: 5.15 C; probe
    P1, F1; an optimizer's apply op or a write in a branch, P3, F3)."""
    writes = _writes(ops)
    if writes:
        raise ValueError(
            "EngineOptions(clipped_sum=\"recompute\") runs the forward pass twice and needs "
            "both to compute the same function, but the forward pass writes variables ("
            + ", ".join(_named(op) for op in writes[:5]) + "): the second pass would write "
            "them again and read the first's writes. Fix: keep state changes out of the layers' "
            "calls (a callback, or the optimizer), or use "
            "EngineOptions.low_memory(clipped_sum=\"second_pass\") (one forward pass).")


def _writes(ops, depth=0):
    found = []
    for op in ops:
        if op.type in _WRITES or op.type.startswith(
                ("ResourceScatter", "ResourceApply", "ResourceSparseApply")):
            found.append(op)
        elif depth < 8:
            found += [write for graph in function_graphs(op) if graph is not None
                      for write in _writes(graph.get_operations(), depth + 1)]
    return found


def _named(op):
    return f"{op.name} ({op.type})"


def _refuse_other_ops(where):
    raise ValueError(
        "EngineOptions(clipped_sum=\"recompute\") runs the forward pass twice and needs both "
        f"to compute the same function, but the second pass traced other ops ({where}): a "
        "layer whose call does something else on a later call of a step (a Python counter or "
        "flag, a tensor kept from its first call) makes the clipped sum of other gradients "
        "than those clipped. Fix: make each call of a layer compute the same function, or use "
        "EngineOptions.low_memory(clipped_sum=\"second_pass\") (one forward pass).")


def computation(ops):
    """[(op, type, attributes, inputs, bodies)] of ``ops`` in creation order, an input named
    by the position of the op making it in ``ops``, a captured eager value (a variable's
    handle, a large constant) by its identity, anything else from outside by its order of
    first use; ``bodies``: the computations of the functions the op runs (a tf.cond's
    branches, a loop's body, a nested tf.function's). What :func:`same_ops_as_first` compares,
    taken before any gradient of ``ops`` (a while loop's gradient adds inputs and outputs)."""
    ops = list(ops)
    captured = _captured_eager_values(ops[0].graph) if ops else {}
    made = {}  # op -> its position among the steps
    outside = {}  # a tensor from outside -> its order of first use
    through = {}  # an engine identity's output -> what it passes on
    steps = []
    for op in ops:
        inputs = [through.get(t.ref(), t) for t in op.inputs]
        if ENGINE_SCOPE in op.name and op.type in ("Identity", "IdentityN"):
            for out, source in zip(op.outputs, inputs):
                through[out.ref()] = source
            continue
        if op.type == "Placeholder":  # a capture (a variable's handle) made on first use
            continue
        wired = tuple(("op", made[t.op], t.value_index) if t.op in made
                      else ("captured", captured[t.ref()]) if t.ref() in captured
                      else ("in", outside.setdefault(t.ref(), len(outside))) for t in inputs)
        made[op] = len(steps)
        steps.append((op, op.type, _attributes(op), wired, _bodies(op)))
    return steps


def _captured_eager_values(graph):
    """{a placeholder's ref: id of the eager value it captured} of a function's graph (a
    value captured from an enclosing graph is an input of the op running the function)."""
    return {internal.ref(): id(external)
            for external, internal in getattr(graph, "captures", ())
            if not tf.is_symbolic_tensor(external)}


def _bodies(op):
    """The computations of the functions ``op`` runs (a branch that scaled its gradient on
    one call only hid in a tf.cond, 5.15 C, probe P1, F1; a tf.switch_case's list of
    branches, P3, F2)."""
    return tuple(None if graph is None else tuple(
        step[1:] for step in computation(graph.get_operations()))
        for graph in function_graphs(op))


def _attributes(op):
    """``op``'s attributes but its functions' names, TF's private ones (``_class``...), a
    string constant's text (an assertion's message names the tensors of its pass) and a
    function call's outputs (under a persistent tape, as the first pass's, TF's call also
    returns what its gradient will need)."""
    attrs = op.node_def.attr
    text = op.type == "Const" and attrs["dtype"].type == tf.string.as_datatype_enum
    calls = any(attrs[name].HasField("func") or attrs[name].list.func for name in attrs)
    return tuple(sorted(
        (name, attrs[name].SerializeToString()) for name in attrs
        if not name.startswith("_") and not attrs[name].HasField("func")
        and not attrs[name].list.func and not (text and name == "value")
        and not (calls and name in ("Tout", "output_shapes"))))


def same_losses_as_first(second, first):
    """``second`` (the recomputed microbatch losses), once checked, at run time, to equal
    ``first`` (the first pass's): a layer whose Python does something else on its second
    call in a step (a counter, a flag) made the clipped sum of other gradients than those
    clipped: 89-152 C for one example, no clipping at all (probe H1, F2). XLA drops the
    assertion: there the losses turn NaN instead, and so does the update."""
    first = tf.stop_gradient(first)
    # A non-finite loss (an example whose gradient is dropped, dp_nonfinite) in both passes
    # is the same.
    both_nonfinite = tf.logical_not(tf.math.is_finite(first) | tf.math.is_finite(second))
    near = tf.reduce_all((tf.abs(second - first) <= 1e-5 + 1e-3 * tf.abs(first))
                         | both_nonfinite)
    poison = tf.where(near, tf.ones([], second.dtype), tf.constant(float("nan"), second.dtype))
    # (The multiplier, not the product, waits for the assertion: the gradient reads it.)
    with tf.control_dependencies([tf.debugging.Assert(near, [_NOT_THE_SAME])]):
        poison = tf.identity(poison)
    return second * poison


_NOT_THE_SAME = (
    "EngineOptions(clipped_sum=\"recompute\") runs the forward pass twice and needs both to "
    "compute the same function, but the second pass's losses differ from the first's (a "
    "layer whose call does something else on its second call of a step: a call counter, a "
    "flag it sets): the clipped sum would be of other gradients than those clipped. Fix: make "
    "each call of a layer in a step compute the same function, or use "
    "EngineOptions.low_memory(clipped_sum=\"second_pass\") (one forward pass).")
