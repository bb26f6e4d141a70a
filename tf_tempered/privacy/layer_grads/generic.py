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
"""The fallback for any trainable layer: per-example gradients by a VJP of that layer alone.

Layers without a registered handler (channels_first convolutions, custom
layers, subclasses with their own `call`...) get the
gradients of their own weights per example from a vectorized VJP of the
recorded call: cheap because it does not go through the rest of the net, and
exact for any layer whose examples do not mix.
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import ScalarLossError, UnsupportedLayerError
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import random_draws
from tf_tempered.privacy.layer_grads.contract import (Handler, LayerResult, NamedPath,
                                                        NoHyperparameters)

__all__ = ["GenericHandler", "norms_from_per_example", "per_example_grads"]


class GenericHandler(Handler):
    """Per-example VJP of the layer's own call (not registered: lookup's fallback)."""

    name = "generic"
    summary = ("any other layer that treats examples independently (channels_first "
               "convolutions, custom layers, quantized variants, LoRA outside Dense/EinsumDense): "
               "a vectorized per-example VJP of the layer alone, logged once per model")
    records_pre_activation = False

    def hyperparameters(self, layer):
        return NoHyperparameters()  # the recorded call is all it needs

    def variables(self, layer, hparams):
        return keras_bridge.own_trainable_weights(layer)

    def layer_result(self, call, hparams, layout):
        variables = keras_bridge.own_trainable_weights(call.layer)
        return norms_from_per_example(variables, per_example_grads(call, variables), layout,
                                      "generic")


def norms_from_per_example(variables, per_example, layout, path_name):
    """The LayerResult from per-example gradients [B, *var.shape] of `variables` (summed per
    microbatch), its path ``NamedPath(path_name)``."""
    num_microbatches = layout.num_microbatches
    grouped = [clip.sum_microbatches(p, num_microbatches) for p in per_example]
    sq = tf.add_n([clip.row_sq_norms(tf.reshape(p, [num_microbatches, -1]), layout.options)
                   for p in grouped])

    def clipped_sum(weights):
        sums = []
        for var, p in zip(variables, grouped):
            flat = weights.zero_nonfinite(tf.reshape(p, [tf.shape(p)[0], -1]))
            sums.append(tf.reshape(clip.weighted_sum(flat, weights.scale), var.shape))
        return sums

    return LayerResult(sq, clipped_sum, NamedPath(path_name), variables=variables)


def per_example_grads(call, variables, bypass_activation=False, options=None):
    """Per-example gradients of a layer's own weights, by a VJP of that layer alone.

    `bypass_activation`: the recorded output (and its gradient) is the layer's
    pre-activation output (handlers with records_pre_activation), so the VJP
    runs the layer's call with its activation set to linear. A handler with
    `slices_call_args` (rnn.py) gets its call's inputs and the tensors among its
    other arguments (mask, initial states) sliced per example too; its output
    may be a structure ([output, *states]). A handler's
    `per_example_while_loop(options)` may ask for a tf.map_fn over the examples.
    """
    slices = call.handler.slices_call_args
    shared = frozenset() if slices else getattr(call, "shared_args", frozenset())

    def all_examples():
        whole = shared if shared and not _reads_per_row(call, shared) else frozenset()
        per_example_args, leaves = _split_call_args(call, slices, whole)
        one_example = _example_vjp(call, variables, leaves)
        elems = (call.inputs, call.grad_output) + ((per_example_args,) if per_example_args
                                                  else ())
        if (call.handler.per_example_while_loop(options)
                or _has_batch_matmul(one_example, elems)):
            # TF 2.21's vectorized_map (pfor) of a batched matmul's gradient with oneDNN
            # on corrupts memory (aborts, or once a wrong norm): a while loop instead.
            # (So do handlers whose call pfor cannot convert: tf-keras' fused LSTM/GRU.)
            return one_at_a_time(one_example, elems)
        try:
            return tf.vectorized_map(one_example, elems)
        except ValueError:  # pfor could not convert the call (a data-dependent loop in it)
            return one_at_a_time(one_example, elems)

    def one_at_a_time(one_example, elems):
        return tf.map_fn(one_example, elems, fn_output_signature=[
            tf.TensorSpec(v.shape, v.dtype) for v in variables])

    try:
        if not bypass_activation:
            return all_examples()
        with keras_bridge.without_activation(call.layer):  # the trace happens now, inside it
            return all_examples()
    except (UnsupportedLayerError, ScalarLossError):
        raise
    except TypeError as error:  # while tracing: a dtype mismatch inside the layer's call
        if getattr(call.layer, "compute_dtype", "float32") != "float32":
            raise _mixed_precision_error(call.layer, error) from error
        raise _one_example_error(call.layer, error) from error
    except ValueError as error:  # while tracing: the call fails on one example's rows
        raise _one_example_error(call.layer, error) from error


def _example_vjp(call, variables, leaves):
    """args → one example's gradients of ``variables``: the layer's call on that example's
    input and per-example arguments (``leaves``: all of the call's, _split_call_args)."""
    def one_example(args):
        x, gy, *rest = args
        y, tape = _one_example_call(call, variables, leaves, x, rest)
        grads = tape.gradient(tf.nest.flatten(y), variables,
                              output_gradients=[g[None] for g in tf.nest.flatten(gy)])
        # A weight the call does not use (or reads behind stop_gradient): zeros. Not the
        # tape's UnconnectedGradients.ZERO, which reads a Keras 3 variable's dtype, a string.
        return [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if g is None else tf.convert_to_tensor(g)
                for g, v in zip(grads, variables)]
    return one_example


def _one_example_call(call, variables, leaves, x, rest):
    """(the call's output on one example, the tape that watched ``variables`` through it)."""
    example_args = rest[0] if rest else {}
    x = tf.nest.map_structure(lambda t: t[None], x)
    call_args, call_kwargs = _merge_call_args(
        call, leaves, tf.nest.map_structure(lambda t: t[None], example_args))
    graph = tf.compat.v1.get_default_graph()
    traced_before = len(graph.get_operations())
    with tf.GradientTape() as tape:
        tape.watch([keras_bridge.watchable(v) for v in variables])
        y = call.call_fn(x, *call_args, **call_kwargs)
    random_draws.refuse_random_ops(call.layer, graph.get_operations()[traced_before:])
    return y, tape


def _reads_per_row(call, shared):
    """Whether the call, given the ``shared`` arguments whole, returns more rows than the one
    example it got: it reads them row by row against its examples (a mask copied to each
    example by ops the trace does not show as copies), so each example gets its row."""
    per_example_args, leaves = _split_call_args(call, False, shared)
    elems = (call.inputs,) + ((per_example_args,) if per_example_args else ())
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
    forward = tf.function(lambda args: _one_example_call(call, [], leaves, args[0], args[1:])[0])
    try:
        outputs = forward.get_concrete_function(spec).structured_outputs
    except (ValueError, TypeError, tf.errors.OpError):  # whole, they do not fit one example
        return True
    rows = {t.shape[0] for t in tf.nest.flatten(outputs) if t.shape.rank}
    return bool(rows - {1, None})


def _mixed_precision_error(layer, error):
    compute_dtype = layer.compute_dtype
    return UnsupportedLayerError(
        f"Layer {layer.name!r} ({type(layer).__name__}) takes the generic per-example VJP, "
        f"which runs its call in float32 (its inputs widened from {compute_dtype} for exact "
        f"norms), and its call mixes that with {compute_dtype} tensors (it casts its weights "
        f"to its compute dtype?): {str(error).strip().splitlines()[-1]} Fix: give this layer "
        "dtype=\"float32\" (the rest of the model keeps mixed precision).")


def _one_example_error(layer, error):
    """The layer's call could not be traced on one example alone (a count of rows fixed in
    it, tf.unstack(x, num=8); an op TF's vectorization and its while loop both fail on)."""
    return UnsupportedLayerError(
        f"Layer {layer.name!r} ({type(layer).__name__}) has no handler of its own, so its "
        "per-example gradients come from its call run on each example alone (a vectorized "
        "VJP, or a tf.map_fn over the examples), and that call failed: "
        f"{_shortened(error)} Fix: write "
        "its call for any number of rows (tf.shape(x)[0], not a fixed count such as "
        "tf.unstack(x, num=8)), use TF's ops for loops in it (tf.scan or tf.while_loop "
        "rather than keras.ops.scan), or register a handler for it "
        "(tf_tempered.privacy.layer_grads.register).")


def _shortened(error, length=300):
    """The last line of the error's message (AutoGraph's trace of user code and Keras' list
    of the call's arguments left out)."""
    lines = [line.strip() for line in str(error).split("Arguments received by")[0].splitlines()
             if line.strip()]
    text = lines[-1] if lines else ""
    if not text.split(":")[0].endswith(("Error", "Exception")):
        text = f"{type(error).__name__}: {text}"
    return text if len(text) <= length else text[:length] + "..."


def _is_per_example(value):
    return isinstance(value, tf.Tensor) and value.shape.rank is not None and value.shape.rank > 0


def _split_call_args(call, slices, whole=frozenset()):
    """(per-example tensors of the call's other arguments, the rest), by position/keyword.

    With `slices` every tensor of rank > 0 is sliced per example; otherwise those whose
    first axis is the batch's (a mask of the inputs, a per-example condition): the
    same static length as the inputs', or both unknown while tracing; but not those in
    ``whole`` (leaf indices: tensors the examples share, privacy/shared_args.py, such as a
    ``[T, T]`` bias with T equal to the batch size), which each example's call gets whole.
    """
    leaves = tf.nest.flatten((call.call_args, call.call_kwargs))
    rows = tf.nest.flatten(call.inputs)[0].shape[0]
    per_example = {i: t for i, t in enumerate(leaves) if _is_per_example(t) and (
        slices or (t.shape[0] == rows and i not in whole))}
    return per_example, leaves


def _merge_call_args(call, leaves, example_args):
    """(args, kwargs) of one example's call: its slices in place of the batch tensors."""
    leaves = [example_args.get(i, t) for i, t in enumerate(leaves)]
    return tf.nest.pack_sequence_as((call.call_args, call.call_kwargs), leaves)


def _has_batch_matmul(one_example, elems):
    """Whether one example's VJP uses a batched matmul (traced once, while tracing the step)."""
    spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape[1:], t.dtype), elems)
    graph = tf.function(one_example).get_concrete_function(spec).graph
    return any(op.type.startswith("BatchMatMul") for op in graph.get_operations())

