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
"""Whether the recorded layer calls of a DP step cover every trainable variable.

The engine computes per-example gradients only for what the forward pass
recorded: the calls of instrumented layers (several calls of one layer are
summed per example, see layer_grads/multi_call.py). A recurrent layer (RNN,
LSTM, GRU...) is one unit: its call covers its cells' variables.
`check` refuses variables outside instrumented layers, and returns the trainable
variables no recorded call covers; after the backward pass
`refuse_unrecorded_dependencies` refuses those the loss depends on (a layer's
weights used without calling it), so that none is trained silently with a zero
gradient.
"""

from tf_tempered import keras_bridge
from tf_tempered.privacy import recording
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["check", "refuse_reads_outside_calls", "refuse_unrecorded_dependencies"]


def check(model, records):
    """Checks every trainable variable belongs to a layer whose gradients we compute.

    Returns [(variable, owning layer)] for the trainable variables that no
    recorded call covers in this step: unused layers (a zero gradient, as TF
    Privacy gives them) or layers whose weights are used without calling them
    (read by another layer), which `refuse_unrecorded_dependencies` tells apart.
    """
    # A layer called more than once is handled by layer_grads.multi_call.
    recorded = {id(record.layer) for record in records}
    owner = {}
    # A recurrent unit owns its cell's variables (recorded as one call, layer_grads/rnn.py).
    nested = keras_bridge.inside_recurrent_units(model)
    for layer in keras_bridge.flatten_layers(model, include_self=True):
        if getattr(layer, "_tf_tempered_instrumented", False) and id(layer) not in nested:
            owner.update((keras_bridge.variable_key(v), layer)
                         for v in recording.own_trainable_weights(layer))
    for var in model.trainable_variables:
        if keras_bridge.overwritten_with_gradient(var):
            layer = owner.get(keras_bridge.variable_key(var))
            raise UnsupportedLayerError(
                f"Trainable variable {var.name!r}"
                f"{f' of layer {layer.name!r}' if layer is not None else ''} is overwritten "
                "with its 'gradient' (Keras 3's float8 training keeps the batch's scales and "
                "amax histories this way: statistics of the batch, not gradients, which "
                "DP-SGD would clip, noise and count in every example's norm). Fix: quantize "
                "with 'int8' or 'int4' (a frozen base, e.g. under LoRA), or train without "
                "float8 quantization.")
        if keras_bridge.variable_key(var) not in owner:
            made = _made_trainable_after_creation(model, var)
            if made is not None:
                raise UnsupportedLayerError(
                    f"Trainable variable {var.name!r} of layer {made.name!r} was created with "
                    "trainable=False and made trainable later (variable.trainable = True): "
                    "TensorFlow's gradient tapes do not watch it, so Keras' own fit leaves it "
                    "untrained too. Fix: create it with add_weight(trainable=True), and freeze "
                    "it while needed with variable.trainable = False.")
            raise UnsupportedLayerError(_outside_every_layer(model, var))
    return [(var, owner[keras_bridge.variable_key(var)]) for var in model.trainable_variables
            if id(owner[keras_bridge.variable_key(var)]) not in recorded]


def _outside_every_layer(model, var):
    """The refusal of a trainable variable no instrumented layer owns, naming the fix for
    where it came from (probe V, F4: a model's own add_weight was told to build first)."""
    if any(v is var for v in keras_bridge.own_trainable_weights(model)):
        return (f"Trainable variable {var.name!r} was created by the model {model.name!r} "
                "itself (its own add_weight, or a tf.Variable attribute): the DP engine takes "
                "per-example gradients layer by layer, from each layer's call, and a model's "
                "own weights are in none. Fix: create it in a keras Layer of its own "
                "(add_weight in that layer's build, used in its call) and call that layer "
                "in the model's call.")
    return (f"Trainable variable {var.name!r} does not belong to a layer the DP engine "
            "instruments (it must be created by a keras Layer with add_weight and used in "
            "that layer's call). Fix: move the variable into a layer; a layer built after "
            "make_private: call make_private(model) after building the model.")


def _made_trainable_after_creation(model, var):
    """The layer that created ``var`` with trainable=False (Keras 3), or None."""
    for layer in keras_bridge.flatten_layers(model, include_self=True):
        if any(v is var for v in getattr(layer, "_non_trainable_variables", [])):
            return layer
    return None


def refuse_unrecorded_dependencies(model, unrecorded, grads):
    """Raises for a variable the loss depends on although no call of its layer was recorded.

    `grads` are the tape's gradients of the loss for `unrecorded`, None where the
    loss does not depend on the variable. Otherwise its per-example gradients
    would be missing: it would get a zero gradient (noise only) and the other
    layers a clip norm that leaves it out (a custom layer reading another
    layer's weights; a recurrent cell whose RNN layer is not in the model).
    """
    for (var, layer), grad in zip(unrecorded, grads):
        if grad is None:  # not used in this forward pass: TF Privacy's zero gradient
            continue
        parent = _rnn_holding(model, layer)
        where = (f"layer {layer.name!r} (the cell of {type(parent).__name__} layer "
                 f"{parent.name!r})" if parent is not None else f"layer {layer.name!r}")
        raise UnsupportedLayerError(
            f"Trainable variable {var.name!r} of {where} affects the loss, but no call of "
            f"{layer.name!r} was recorded in the forward pass, so the fast DP engine cannot "
            "compute its per-example gradients (it would get a zero gradient and the other "
            "layers a clip norm that leaves it out). This happens when a layer's weights "
            "are used without calling the layer (e.g. another layer reads them). Fix: use "
            "a layer's weights only in its own call (an RNN cell through its "
            "keras.layers.RNN layer), or train this model without make_private: "
            "compiled with TF Privacy's optimizer of the same name (tensorflow_privacy: "
            "Keras 2 with TF_USE_LEGACY_KERAS=1, Python <= 3.11; tf_tempered's own DP "
            "optimizers refuse to train without make_private), it then gets TF Privacy's "
            "own (slower) per-microbatch gradients, which back-propagate through every "
            "layer.")


# Ops on a variable's handle that do not read its value into the computation (a layer
# built at its first call, inside the traced step, initializes its weights then).
_NOT_READS = frozenset({"VarIsInitializedOp", "AssignVariableOp", "AssignAddVariableOp",
                        "AssignSubVariableOp", "DestroyResourceOp", "VariableShape"})


# Ops through which no gradient flows back to their inputs: a read whose value reaches
# the loss only through them (Keras 3's SpectralNormalization compares its wrapped
# layer's kernel with 0 and assigns the normalized kernel to it before the layer's
# call reads it) adds nothing to the variable's gradient.
_NO_GRADIENT = frozenset({
    "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp", "StopGradient",
    "PreventGradient", "Equal", "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual",
    "All", "Any", "IsFinite", "IsNan", "IsInf", "LogicalAnd", "LogicalOr", "LogicalNot",
    "Shape", "ShapeN", "Size", "Rank", "ArgMax", "ArgMin"})


def _reaches_differentiably(op, target):
    """Whether a data path from ``op``'s outputs to the op ``target`` carries a gradient:
    float tensors only, not through an op of ``_NO_GRADIENT``. A nested function or a
    cond counts as passing every input to every output (conservative)."""
    stack, seen = [op], {op.name}
    while stack:
        current = stack.pop()
        if current.name == target.name:
            return True
        for out in current.outputs:
            if not (out.dtype.is_floating or out.dtype.is_complex):
                continue
            for consumer in out.consumers():
                if consumer.type not in _NO_GRADIENT and consumer.name not in seen:
                    seen.add(consumer.name)
                    stack.append(consumer)
    return False


def refuse_reads_outside_calls(recorder, loss=None):
    """Raises for a recorded layer's weight read in the forward pass outside its calls.

    A handler computes a layer's per-example gradient from its recorded calls
    only; a weight also used elsewhere (tied input/output embeddings:
    `ops.matmul(h, embedding.embeddings, transpose_b=True)`) would have that
    use's gradient left out of the norm and the update. A read whose value does not
    reach ``loss`` (the step's scalar) through ops with a gradient is no such use
    (SpectralNormalization's power iteration, which writes the wrapped layer's kernel
    before its call). Checked while tracing, from the graph ops each call created (no
    cost per step); nothing to check in eager mode (run_eagerly=True), where the check
    cannot see the reads.
    """
    graph = recorder.graph
    if graph is None or not recorder.forward_ops:
        return
    position = {op.name: i for i, op in enumerate(recorder.forward_ops)}
    inside, first_call = {}, {}
    for record in recorder.records:
        inside.setdefault(id(record.layer), set()).update(op.name for op in record.ops)
        if record.ops:
            start = position.get(record.ops[0].name, len(position))
            first_call[id(record.layer)] = min(first_call.get(id(record.layer), start), start)
    captured = {id(external): internal for external, internal in graph.captures}
    seen = set()
    for record in recorder.records:
        if id(record.layer) in seen:
            continue
        seen.add(id(record.layer))
        for var in recording.own_trainable_weights(record.layer):
            internal = captured.get(id(keras_bridge.watchable(var).handle))
            if internal is None:
                continue
            short_name = var.name.split("/")[-1].split(":")[0]
            for op in internal.consumers():
                if (op.type in _NOT_READS or op.name not in position
                        or op.name in inside[id(record.layer)]):
                    continue
                if (position[op.name] < first_call.get(id(record.layer), 0)
                        and f"/{short_name}/" in f"/{op.name}"):
                    continue  # the variable's own initialization (built at its first call)
                if loss is not None and not _reaches_differentiably(op, loss.op):
                    continue  # no gradient to leave out
                raise UnsupportedLayerError(
                    f"Trainable variable {var.name!r} of layer {record.layer.name!r} is "
                    f"used in the forward pass outside that layer's call (by op "
                    f"{op.name!r}), e.g. an embedding matrix tied to the output "
                    "projection. The fast DP engine computes a layer's per-example "
                    "gradients from its calls only, so that use's gradient would be "
                    "missing from the clipping norm. Fix: use the weight only inside "
                    "the call of the layer that owns it (add_weight in its build; a layer "
                    "holding a keras.layers.Embedding and reading its table is a second "
                    "owner and refused too): e.g. one layer whose call does the lookup "
                    "and, called again, the tied projection (as keras_hub's "
                    "ReversibleEmbedding), or untie the weights with a separate output "
                    "Dense.")


def _rnn_holding(model, cell):
    """The RNN layer of `model` whose cell is `cell`, or None."""
    for layer in keras_bridge.flatten_layers(model):
        if getattr(layer, "cell", None) is cell:
            return layer
    return None
