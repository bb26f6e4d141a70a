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
"""TF graphs read: a traced function's ops and, recursively, those of the functions they
run (a tf.function's call, a while loop's body and condition, a tf.cond's branches). TF has
no public way to reach a function's body from the op that calls it; this reads the graph's
private ``_get_function``.

>>> from tf_tempered._compat import tf
>>> helper = tf.function(lambda t: tf.random.uniform([2]) * t)
>>> graph = tf.function(lambda t: helper(t)).get_concrete_function(tf.TensorSpec([2])).graph
>>> "RandomUniform" in [op.type for op in graph.get_operations()]
False
>>> "RandomUniform" in [op.type for op in with_function_bodies(graph.get_operations())]
True
"""

__all__ = ["custom_gradient_code", "with_function_bodies"]

# Attributes naming the functions an op runs: a tf.function's call, a while loop's body and
# condition, a tf.cond's branches.
_FUNCTION_ATTRS = ("f", "body", "cond", "then_branch", "else_branch", "branches")


def with_function_bodies(ops, seen=None, depth=0):
    """``ops`` and, recursively, the ops of the functions they run, to a depth of 8 (probe X,
    F2: a draw in a tf.function helper, a tf.while_loop body or a tf.cond branch was not
    seen by a read of the ops alone)."""
    seen = set() if seen is None else seen
    for op in ops:
        yield op
        for attr in (a for a in _FUNCTION_ATTRS if depth < 8 and a in op.node_def.attr):
            value = op.get_attr(attr)
            for name in (f.name for f in (value if isinstance(value, list) else [value])):
                function = None if name in seen else op.graph._get_function(name)  # pylint: disable=protected-access
                seen.add(name)
                if getattr(function, "graph", None) is not None:
                    yield from with_function_bodies(function.graph.get_operations(), seen,
                                                     depth + 1)


def custom_gradient_code(op):
    """The source files of the Python functions ``op``'s custom gradient runs (the function
    tf.custom_gradient registered for it, and the functions it holds, a few levels deep);
    () if the op has none registered here (a gradient this process did not trace)."""
    from tensorflow.python.framework import ops as tf_ops  # pylint: disable=g-import-not-at-top
    name = op.get_attr("_gradient_op_type").decode()
    try:
        function = tf_ops._gradient_registry.lookup(name)  # pylint: disable=protected-access
    except LookupError:
        return ()
    return tuple(_code_files(function, set(), 0))


def _code_files(function, seen, depth):
    if id(function) in seen or depth > 6:
        return
    seen.add(id(function))
    code = getattr(function, "__code__", None)
    if code is not None:
        yield code.co_filename
    for cell in getattr(function, "__closure__", None) or ():
        try:
            held = cell.cell_contents
        except ValueError:  # a cell not yet filled
            continue
        if callable(held):
            yield from _code_files(getattr(held, "__func__", held), seen, depth + 1)
