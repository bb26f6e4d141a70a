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
"""Variables the DP step's forward pass writes from the batch's data: refused while it traces.

A layer that keeps statistics of its inputs in a variable (a running mean, as
BatchNormalization's moving mean; a metric updated in its call) writes data of the batch into the model, and the model is released outside ε. On the
generic path the layer's call also runs again per example, which would write one example's
values (a probe found x[0] itself in a running mean). A write whose value does not depend
on the batch's values (a dropout layer's seed state, a call counter) passes.

>>> import tensorflow as tf
>>> mean, calls = tf.Variable(tf.zeros(3)), tf.Variable(0.0)
>>> @tf.function
... def forward(x):
...     calls.assign_add(1.0)
...     mean.assign(0.9 * mean + 0.1 * tf.reduce_mean(x, 0))
...     return x * 2
>>> graph = forward.get_concrete_function(tf.TensorSpec((4, 3))).graph
>>> [op.type for op in writes_from_the_batch(graph.get_operations(), graph.inputs[:1])]
['AssignVariableOp']
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import row_layout
from tf_tempered.privacy.errors import NotPrivateError

__all__ = ["refuse_writes_from_the_batch", "writes_from_the_batch"]

_WRITES = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "ResourceScatterUpdate",
    "ResourceScatterAdd", "ResourceScatterSub", "ResourceScatterMul", "ResourceScatterDiv",
    "ResourceScatterMin", "ResourceScatterMax", "ResourceScatterNdUpdate",
    "ResourceScatterNdAdd", "ResourceScatterNdSub"})


def writes_from_the_batch(forward_ops, batch_tensors, memo=None):
    """The variable writes among ``forward_ops`` whose value depends on ``batch_tensors``'
    values (their shapes aside)."""
    sources = {t.op for t in tf.nest.flatten(batch_tensors)
               if isinstance(t, tf.Tensor) and hasattr(t, "op")}
    memo = {} if memo is None else memo
    return [op for op in forward_ops if op.type in _WRITES and len(op.inputs) > 1
            and any(row_layout.batch_axis(t, sources, memo) is not None for t in op.inputs[1:])]


def refuse_writes_from_the_batch(forward_ops, batch_tensors):
    """Raises NotPrivateError naming the first write of batch data into a variable."""
    if tf.executing_eagerly() or not forward_ops:
        return
    found = writes_from_the_batch(forward_ops, batch_tensors)
    if found:
        raise NotPrivateError(
            f"The model's forward pass writes values computed from the training batch into a "
            f"variable ({found[0].name}): statistics of the private data (a running mean of a "
            "layer's inputs, a metric updated in a layer's call) would be released with the "
            "model outside ε, and a layer's call that runs again per example would write one "
            "example's values. Fix: keep no statistics of the training data in the model during "
            "DP training: drop the write (or write only when the layer is called with "
            "training=False), compute such statistics from public data "
            "(make_private(public_layers=...)), or release them with DP yourself and compose "
            "that release into ε (PrivacyBudget).")
