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
BatchNormalization's moving mean; a metric updated in its call; a queue or lookup table of
inputs) writes data of the batch into the model, which is released outside ε; a summary or
a print of them is a release too. On the generic path the layer's call also runs again per
example, which would write one example's values (a probe found x[0] itself in a running
mean). A write whose value does not depend on the batch's values (a dropout layer's seed
state, a call counter) passes. A nested function taking the batch's values (tf.cond,
tf.while_loop, an inner tf.function) whose body writes is refused whatever it writes.

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
    "ResourceScatterNdAdd", "ResourceScatterNdSub", "ResourceStridedSliceAssign",
    "LookupTableInsertV2", "LookupTableImportV2",
    # Releases outside the model, as much outside ε: summaries, prints, files.
    "WriteSummary", "WriteScalarSummary", "WriteHistogramSummary", "WriteImageSummary",
    "WriteAudioSummary", "WriteRawProtoSummary", "PrintV2", "Print", "WriteFile"})
_PRINTS = frozenset({"PrintV2", "Print"})  # no resource first: every input is printed
# Ops that run a function of the graph's library: writes inside them are looked for too.
_CALLS = {"PartitionedCall": ("f",), "StatefulPartitionedCall": ("f",),
          "If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
          "While": ("cond", "body"), "StatelessWhile": ("cond", "body"),
          "Case": ("branches",), "StatelessCase": ("branches",)}


def writes_from_the_batch(forward_ops, batch_tensors, memo=None):
    """The variable writes (and summaries, prints) among ``forward_ops`` whose value depends
    on ``batch_tensors``' values (their shapes aside), and the calls of nested functions
    (tf.cond, tf.while_loop, an inner tf.function) taking the batch's values whose bodies
    write."""
    sources = {t.op for t in tf.nest.flatten(batch_tensors)
               if isinstance(t, tf.Tensor) and hasattr(t, "op")}
    memo = {} if memo is None else memo

    def from_the_batch(op, first):
        return any(row_layout.batch_axis(t, sources, memo) is not None
                   for t in op.inputs[first:])

    found = [op for op in forward_ops if op.type in _WRITES
             and from_the_batch(op, 0 if op.type in _PRINTS else 1)]
    calls = [op for op in forward_ops if op.type in _CALLS and from_the_batch(op, 0)]
    if calls:
        writing = _writing_functions(calls[0].graph)
        found += [op for op in calls if _called(op) & writing]
    return found


def _called(op):
    """Names of the functions ``op`` runs."""
    names = set()
    for attribute in _CALLS.get(op.type, ()):
        value = op.node_def.attr[attribute]
        names.update([value.func.name] if value.HasField("func") else
                     [f.name for f in value.list.func])
    return names


def _writing_functions(graph):
    """Names of the graph library's functions that write (themselves or a function they
    call)."""
    library = graph.as_graph_def().library.function
    calls, writes = {}, set()
    for function in library:
        name = function.signature.name
        calls[name] = {a.func.name for node in function.node_def for a in node.attr.values()
                       if a.HasField("func")} | {
                       f.name for node in function.node_def for a in node.attr.values()
                       for f in a.list.func}
        if any(node.op in _WRITES for node in function.node_def):
            writes.add(name)
    grew = True
    while grew:
        more = {name for name, called in calls.items() if called & writes} - writes
        writes |= more
        grew = bool(more)
    return writes


def refuse_writes_from_the_batch(forward_ops, batch_tensors):
    """Raises NotPrivateError naming the first write of batch data into a variable."""
    if tf.executing_eagerly() or not forward_ops:
        return
    found = writes_from_the_batch(forward_ops, batch_tensors)
    if found:
        raise NotPrivateError(
            f"The model's forward pass writes values computed from the training batch into a "
            f"variable, a summary or a print ({found[0].name}): statistics of the private data (a running mean of a "
            "layer's inputs, a metric updated in a layer's call) would be released with the "
            "model outside ε, and a layer's call that runs again per example would write one "
            "example's values. Fix: keep no statistics of the training data in the model during "
            "DP training and print or summarize none of it: drop the write, summary or print (or "
            "make it only when the layer is called with training=False), compute such statistics from public data "
            "(make_private(public_layers=...)), or release them with DP yourself and compose "
            "that release into ε (PrivacyBudget).")
