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

import contextlib
import threading

__all__ = ["custom_gradients_dropped", "custom_gradient_code", "record_custom_gradients",
           "with_function_bodies"]

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
    """The source files of the function ``tf.custom_gradient`` decorated to make ``op``'s
    gradient (and of the functions it holds, a few levels deep), as recorded when it was
    traced (record_custom_gradients); () if it was not recorded. The decorated function,
    not the gradient it returns: a gradient may be TF's own code doing anything
    (``tf.math.cumsum``, a partial of ``tf.reverse``: probe A2, F1), while the function
    choosing it is TF's (tf.nn.silu) or the user's."""
    return _DECORATED.get(op.get_attr("_gradient_op_type").decode(), ())


_DECORATED = {}  # a custom gradient's registered name -> its decorated function's files
_PENDING = threading.local()  # the functions being decorated, innermost last


def record_custom_gradients():
    """Once: TF's graph-mode custom_gradient records, for each gradient name it makes, the
    source files of the function it decorates (custom_gradient_code). TF keeps no link
    from the gradient's name to that function."""
    from tensorflow.python.ops import custom_gradient as module  # pylint: disable=g-import-not-at-top
    if getattr(module, "_tf_tempered_recorded", False):
        return
    decorate, generate_name = module._graph_mode_decorator, module.generate_name  # pylint: disable=protected-access

    def recorded_decorate(f, args, kwargs):
        pending = _pending()
        pending.append(f)
        try:
            return decorate(f, args, kwargs)
        finally:
            pending.pop()

    def recorded_name():
        name = generate_name()
        pending = _pending()
        if pending and pending[-1] is not None:  # its first call names the gradient
            _DECORATED[name] = tuple(_code_files(pending[-1], set(), 0))
            pending[-1] = None
        return name

    module._graph_mode_decorator = recorded_decorate  # pylint: disable=protected-access
    module.generate_name = recorded_name
    module._tf_tempered_recorded = True  # pylint: disable=protected-access


@contextlib.contextmanager
def custom_gradients_dropped():
    """Within it, the gradient functions TF's graph-mode custom_gradient registers (one per
    traced call, in TF's global registry, which is never emptied, each holding its graph)
    are unregistered at exit: for a graph differentiated only inside itself, traced anew
    each step (an eager step's passes: 11 graphs, 2.1 MB, kept every step; probe G3, F2)."""
    from tensorflow.python.framework import ops  # pylint: disable=g-import-not-at-top
    registry = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
    before = set(registry) if isinstance(registry, dict) else None
    try:
        yield
    finally:
        if before is not None:
            for name in set(registry) - before:
                if name.startswith("CustomGradient"):
                    del registry[name]
                    _DECORATED.pop(name, None)


def _pending():
    if not hasattr(_PENDING, "functions"):
        _PENDING.functions = []
    return _PENDING.functions


def _code_files(function, seen, depth):
    """The source files of ``function`` and of the callables it holds (its closure; what a
    partial, a bound method, a tf.function or a callable object runs)."""
    if function is None or id(function) in seen or depth > 6:
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
                yield from _code_files(held, seen, depth + 1)
        return
    for attribute in ("__func__", "func", "python_function", "__wrapped__"):
        yield from _code_files(getattr(function, attribute, None), seen, depth + 1)
    if not isinstance(function, type):  # a callable object: its class's __call__
        yield from _code_files(getattr(type(function), "__call__", None), seen, depth + 1)
