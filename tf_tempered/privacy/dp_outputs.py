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
"""Which gradients came out of a DPGradients call: what a custom loop may apply.

``DPGradients`` registers the noisy gradients it returns; an optimizer updating the weights
of a model with a DPGradients then checks that each gradient it applies is one of them
(eagerly: the same tensor object) or, while tracing, computed from one of them (a cast,
a scale, the unscaling of a LossScaleOptimizer). Raw ``tape.gradient`` gradients of such a
model are refused instead of training it without clipping or noise. Not seen: a raw
gradient added to a DP one in the graph, and, eagerly, a DP gradient transformed before
it is applied (refused: apply it as returned, and let the optimizer transform it).

>>> import tensorflow as tf
>>> dp, raw = tf.constant([1.0]), tf.constant([2.0])
>>> register([dp])
>>> came_from_dp(dp), came_from_dp(raw)
(True, False)
"""

import weakref

from tf_tempered._compat import tf

__all__ = ["register", "came_from_dp"]

_EAGER = weakref.WeakValueDictionary()  # id -> the eager tensor DPGradients returned
_TRACED = weakref.WeakKeyDictionary()   # graph -> names of the ops whose outputs it returned


def register(gradients):
    """Records ``gradients`` (DPGradients' results; None entries skipped)."""
    for grad in gradients:
        grad = getattr(grad, "values", grad)  # IndexedSlices
        if grad is None:
            continue
        if isinstance(grad, tf.Tensor) and hasattr(grad, "graph") and not tf.executing_eagerly():
            _TRACED.setdefault(grad.graph, set()).add(grad.op.name)
        elif hasattr(grad, "numpy"):
            _EAGER[id(grad)] = grad


def came_from_dp(grad):
    """Whether ``grad`` is a registered DP gradient or, traced, computed from one."""
    grad = getattr(grad, "values", grad)
    if grad is None:
        return True
    if _EAGER.get(id(grad)) is grad:
        return True
    if not hasattr(grad, "op") or tf.executing_eagerly() and hasattr(grad, "numpy"):
        return False
    return _traced_from_dp(grad)


def _traced_from_dp(grad):
    """Walks ``grad``'s data ancestors, across the captures of nested functions."""
    stack, seen, captures = [grad], set(), {}
    while stack:
        tensor = stack.pop()
        key = (id(tensor.graph), tensor.op.name)
        if key in seen:
            continue
        seen.add(key)
        graph = tensor.graph
        if tensor.op.name in _TRACED.get(graph, ()):
            return True
        stack.extend(tensor.op.inputs)
        if tensor.op.type != "Placeholder":
            continue
        if id(graph) not in captures:
            captures[id(graph)] = {id(inner): outer
                                   for outer, inner in getattr(graph, "captures", ())}
        captured = captures[id(graph)].get(id(tensor))
        if captured is not None:
            if hasattr(captured, "op"):  # a symbolic tensor of the enclosing graph
                stack.append(captured)
            elif _EAGER.get(id(captured)) is captured:
                return True
    return False
