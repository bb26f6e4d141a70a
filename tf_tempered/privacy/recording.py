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
"""Recording hooks: what each trainable layer saw and produced in the forward pass.

`instrument(model)` wraps the `call` of every layer that owns weights (or has an
activity regularizer).
While a `Recorder` is active (the DP training step), each call leaves a
`LayerRecord` with the layer's input, its output (the pre-activation output
when the layer's handler asks for it, see layer_grads/: the activation is then
applied after recording) and the handler that will compute its per-microbatch
gradients; otherwise the hook does nothing, so inference, evaluation and saving
are unaffected. A recurrent layer (RNN and its subclasses; a Bidirectional's
two) is instrumented as one unit, its cells not at all: SimpleRNN, LSTM and GRU
record what their own forward pass computes (layer_grads/rnn_rows.py), other
recurrent layers the whole call (inputs, mask and initial states in its
arguments, and its output or [output, *states]), see layer_grads/rnn.py.
"""

import contextlib
import functools
import threading

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import batch_statistics, layer_grads
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["LayerRecord", "Recorder", "instrument",
           "own_trainable_weights"]


_STATE = threading.local()


def _active_recorder():
    return getattr(_STATE, "recorder", None)


class LayerRecord:
    """What one call of an instrumented layer left for the backward pass."""

    def __init__(self, layer, handler, hparams, inputs, output, call_args, call_kwargs, call_fn):
        self.layer = layer
        self.handler = handler  # a layer_grads.Handler
        self.hparams = hparams  # the layer's hyperparameters as plain values (handler's adapter)
        self.inputs = inputs
        # Z (pre-activation) if handler.records_pre_activation, the output otherwise.
        self.output = output
        self.call_args = call_args
        self.call_kwargs = call_kwargs
        self.call_fn = call_fn  # the layer's own, uninstrumented call
        self.grad_output = None  # ∂(Σ ℓ_m)/∂output, filled after the backward pass
        self.ops = ()  # graph ops this call created (while tracing)
        # Leaf indices of call_args/kwargs the batch's examples share (shared_args.py),
        # passed whole to each example's call by the generic VJP.
        self.shared_args = frozenset()

    @property
    def kind(self):
        """The handler's name ("dense", "conv2d", ..., "generic"): for messages and tests."""
        return self.handler.name


def _graph_position():
    """(graph, number of ops so far) while tracing a tf.function; (None, 0) when eager."""
    if tf.executing_eagerly():
        return None, 0
    graph = tf.compat.v1.get_default_graph()
    return graph, len(graph.get_operations())


class Recorder:
    """Collects LayerRecords while active (a context manager, per thread).

    While tracing, it also notes which graph ops the forward pass created
    (`forward_ops`) and each recorded call created (`LayerRecord.ops`), so that
    coverage.refuse_reads_outside_calls can find a weight read outside its
    layer's calls (tied weights), whose gradient no handler would see.
    """

    def __init__(self, norm_hooks=None, activity_regularizers=None, options=None):
        self.records = []
        self.graph, self._start = None, 0
        self.forward_ops = ()
        # clipped_sum.NormHooks, or None: computes each layer's norms inside the
        # backward pass (EngineOptions.norms_in_backward, clipped_sum="second_pass"...).
        self.norm_hooks = norm_hooks
        self.options = options  # the step's EngineOptions (None: the defaults)
        # {id(layer): (layer, regularizer)} of the activity regularizers Keras does not
        # apply in this forward pass; each call's outputs are kept in activity_outputs
        # as (layer, regularizer, outputs), for a penalty per example.
        self.activity_regularizers = dict(activity_regularizers or {})
        self.activity_outputs = []

    def capture_activity(self, layer, outputs):
        """Keeps ``outputs`` of ``layer`` if its activity regularizer is the engine's to apply."""
        found = self.activity_regularizers.get(id(layer))
        if found is not None:
            self.activity_outputs.append((layer, found[1], outputs))

    @contextlib.contextmanager
    def active(self):
        previous = _active_recorder()
        _STATE.recorder = self
        self.graph, self._start = _graph_position()
        try:
            yield self
        finally:
            _STATE.recorder = previous

    def end_forward(self):
        """Marks the end of the forward pass (model call and loss)."""
        graph, end = _graph_position()
        if graph is not None and graph is self.graph:
            self.forward_ops = graph.get_operations()[self._start:end]


own_trainable_weights = keras_bridge.own_trainable_weights


def instrument(model):
    """Installs recording hooks on every layer of `model` that owns weights (trainable or
    frozen: a frozen layer may be unfrozen later) or has an activity regularizer.

    Idempotent; the DP step calls it again each time it is traced, so layers unfrozen
    or added since make_private are covered. Returns the instrumented layers. The
    hook is a no-op unless a Recorder is active, so inference, evaluation and saving
    are unaffected. A trainable BatchNormalization is refused when it is called in
    training mode, a layer blending examples (MixUp, CutMix) always (:mod:`.batch_statistics`).
    """
    layers = []
    # A recurrent unit's call is recorded as a whole: its cell and wrapped layers are not.
    nested = keras_bridge.inside_recurrent_units(model)
    for layer in keras_bridge.flatten_layers(model):
        if keras_bridge.mixes_batch_examples(layer):
            raise batch_statistics.mixing_error(layer)
        if id(layer) in nested:
            if keras_bridge.is_trainable_batch_norm(layer):  # not wrapped: refused here
                raise batch_statistics.error(layer)
            continue
        # An unbuilt layer may create weights at its first call (Keras 3 builds a
        # Dense's activation layer only then): instrument it too.
        # (built first: tf-keras' unbuilt Sequential raises on .weights)
        if (layer.built and not layer.weights
                and getattr(layer, "activity_regularizer", None) is None):
            continue
        if not getattr(layer, "_tf_tempered_instrumented", False):
            _wrap_call(layer)
        layers.append(layer)
    return layers


# Keras 3 calls a quantized layer's quantized_call instead of call (int8 or int4: a frozen
# base under LoRA): both are recorded, by a function set on the layer (model_files lifts it
# while tf-keras writes a SavedModel).
RECORDED_METHODS = ("call", "quantized_call")


def _wrap_call(layer):
    for name in RECORDED_METHODS:
        if callable(getattr(layer, name, None)):
            keras_bridge.set_untracked(layer, name, _recording(layer, getattr(layer, name)))
    keras_bridge.set_untracked(layer, "_tf_tempered_instrumented", True)


def _recording(layer, original_call):
    """``original_call`` of ``layer``, recorded while a Recorder is active."""

    @functools.wraps(original_call)
    @tf.autograph.experimental.do_not_convert
    def call(inputs, *args, **kwargs):
        converted_call = keras_bridge.autographed_call(layer, original_call)
        recorder = _active_recorder()
        if recorder is None or keras_bridge.computing_a_mask():
            # (A call for a mask only: tf-keras' TimeDistributed(model) runs the inner model
            # again for its mask, values dropped, no gradient. Recorded, it was refused as a
            # second call on [B·T] rows; probe Q.)
            return converted_call(inputs, *args, **kwargs)
        # Before the weights test: a BatchNormalization without γ and β (center=False,
        # scale=False) still mixes the examples that flow through it.
        batch_statistics.refuse_in_training_mode(layer, args, kwargs)
        if own_trainable_weights(layer):
            outputs = _recorded_call(recorder, layer, converted_call, inputs, args, kwargs)
        else:  # frozen (or without weights): nothing to clip
            outputs = converted_call(inputs, *args, **kwargs)
        recorder.capture_activity(layer, outputs)
        return outputs

    return call


def _recorded_call(recorder, layer, original_call, inputs, args, kwargs):
    """The outputs of one call of a trainable layer, leaving its LayerRecord in ``recorder``."""
    unit = keras_bridge.is_recurrent_unit(layer)
    keras_bridge.with_declared_axes(layer, inputs)  # the norm paths size rows by them
    if _dense_tensors(inputs, allow_nested=False) or unit:
        # Keras built the layer before calling `call`: its hyperparameters are known.
        handler, hparams = layer_grads.lookup(layer)
    else:
        # Called on several tensors (a list or dict: attention layers, FiLM): the
        # per-example VJP of the layer's call over all of them.
        _check_structure(layer, inputs)
        handler, hparams = layer_grads.GENERIC, layer_grads.GENERIC.hyperparameters(layer)
    graph, start = _graph_position()
    if graph is not recorder.graph:
        raise UnsupportedLayerError(_nested_graph_message(layer))
    record = None
    if handler.records_own_forward:
        # The handler runs the layer's math itself to record the tensors it needs
        # (rnn_rows.py), or declines this call: then the next handler takes it.
        record, outputs = _own_forward(recorder, layer, handler, hparams, original_call,
                                       inputs, args, kwargs)
        if record is None:
            handler, hparams = layer_grads.lookup(layer, skip=(handler,))
    if record is not None:
        pass  # recorded by the handler
    elif handler.records_pre_activation:
        # Record the pre-activation output (the activation swapped untracked, so the
        # layer's weight order and sub-layer list stay untouched).
        with keras_bridge.without_activation(layer) as activation:
            z = original_call(inputs, *args, **kwargs)
        record = LayerRecord(layer, handler, hparams, inputs, z, args, kwargs, original_call)
        if recorder.norm_hooks is not None:
            z = recorder.norm_hooks.wrap(record, z)
        outputs = activation(z) if activation is not None else z
    else:
        outputs = original_call(inputs, *args, **kwargs)
        # A recurrent unit may return [output, *states] (return_state=True); the
        # generic VJP takes any structure of tensors.
        # (A recurrent cell called outside an RNN layer returns (output, states): refused,
        # its loop is not one the engine records as a unit.)
        nested_ok = unit or (handler is layer_grads.GENERIC and not hasattr(layer, "state_size"))
        if not _dense_tensors(outputs, allow_nested=nested_ok, variables=False):
            raise UnsupportedLayerError(_many_outputs_message(layer, outputs))
        record = LayerRecord(layer, handler, hparams, inputs, outputs, args, kwargs,
                             original_call)
        if recorder.norm_hooks is not None and not unit:
            outputs = recorder.norm_hooks.wrap(record, outputs)
    if graph is not None:
        record.ops = graph.get_operations()[start:]
    recorder.records.append(record)
    return outputs


def _check_structure(layer, inputs):
    """Refuses inputs that are not a structure of dense tensors (sparse, ragged, none)."""
    if not _dense_tensors(inputs, allow_nested=True):
        raise UnsupportedLayerError(
            f"Layer {layer.name!r} received {type(inputs).__name__} inputs that are not "
            "dense tensors (e.g. a SparseTensor or RaggedTensor); the DP engine computes "
            "per-example gradients from dense tensors whose first axis is the batch. Fix: "
            "convert them to dense tensors (tf.sparse.to_dense, .to_tensor()) before the "
            "layer.")


def _own_forward(recorder, layer, handler, hparams, call_fn, inputs, args, kwargs):
    """(record, outputs) of a call the handler runs itself, or (None, None) if it declines."""
    record = LayerRecord(layer, handler, hparams, None, None, args, kwargs, call_fn)
    hooks = recorder.norm_hooks
    wrap = (lambda t: hooks.wrap(record, t)) if hooks is not None else (lambda t: t)
    own = handler.recorded_call(layer, hparams, call_fn, inputs, args, kwargs, wrap,
                                options=recorder.options)
    if own is None:
        return None, None
    outputs, record.inputs, record.output = own
    return record, outputs


def _dense_tensors(value, allow_nested, variables=True):
    """Whether `value` is one dense tensor (or, if allow_nested, a structure of them)."""
    leaves = tf.nest.flatten(value) if allow_nested else [value]
    kinds = (tf.Tensor, tf.Variable) if variables else (tf.Tensor,)
    return bool(leaves) and all(isinstance(t, kinds) and not isinstance(t, tf.SparseTensor)
                                for t in leaves)


_NO_FAST_PATH = (
    "Train this model without make_private: compiled with TF Privacy's optimizer "
    "of the same name (tensorflow_privacy: Keras 2 with TF_USE_LEGACY_KERAS=1, "
    "Python <= 3.11; tf_tempered's own DP optimizers refuse to train without "
    "make_private), it then gets TF Privacy's own (slower) per-microbatch gradients, "
    "which back-propagate through every layer.")


def _nested_graph_message(layer):
    return (f"Layer {layer.name!r} ({type(layer).__name__}) is called inside a loop or nested "
            "function of the forward pass (tf-keras' TimeDistributed loops over time steps "
            "for a custom layer when the batch size is static; a layer or RNN inside a "
            "custom layer's tf.while_loop or tf.map_fn), "
            "so what it saw cannot be used by the DP engine, which computes per-example "
            "gradients from each trainable layer's calls in the forward pass itself. Fix: "
            "apply the layer to the whole sequence without TimeDistributed if it acts on the "
            "last axis (e.g. an elementwise activation), feed batches of unknown size "
            "(tf.data without drop_remainder: TimeDistributed then calls its layer once on "
            "[batch·time, ...]), or use Keras 3, whose TimeDistributed calls the layer once "
            f"per time step in the forward pass (supported). {_NO_FAST_PATH}")


def _many_outputs_message(layer, outputs):
    if hasattr(layer, "state_size"):  # an RNN cell called outside a keras RNN layer
        return (f"Layer {layer.name!r} ({type(layer).__name__}) is a recurrent cell called "
                "outside a keras.layers.RNN layer: its weights are used at every time step "
                "of a loop the DP engine cannot record. Fix: run the cell with "
                "keras.layers.RNN(cell) (or SimpleRNN/LSTM/GRU, Bidirectional), which the "
                f"engine records as one unit. {_NO_FAST_PATH}")
    return (f"Layer {layer.name!r} ({type(layer).__name__}) returns "
            f"{type(outputs).__name__}; the fast DP engine supports trainable layers with "
            "one tensor output. Make the layer return one tensor (split it into layers "
            f"that do), or: {_NO_FAST_PATH}")
