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
"""Per-layer gradient handlers: one per layer family, registered against the layer class.

A handler turns what the forward and the one backward pass recorded for a layer
call (its input, the gradient of the summed microbatch losses w.r.t. its
output, and its hyperparameters as plain values) into

* the squared norm of each microbatch's gradient of the layer's own trainable
  variables, [M], and
* a way to form Σ_m c_m·g_m for clip factors c (book-keeping: no second
  backward pass),

without Keras-version-specific objects beyond `hyperparameters` (the small
adapter that reads a layer). The engine never branches on the layer type: it
asks `lookup(layer)` for the handler.

Registering a handler for class K applies it to layers of K and of subclasses
that inherit K's `call` unchanged; a subclass with its own `call` may compute
something else, so it takes the generic per-example VJP (generic.py), as do
unregistered layers and registered ones whose `hyperparameters` returns None
(a variant the handler does not cover, e.g. Conv2D with groups > 1).

Adding a layer type: a module here with a `Handler` subclass decorated with
`@register(LayerClass)`, imported at the bottom of this file, and one entry in
tests/conformance_cases.py (run by tests/test_layer_grads_conformance.py against a
float64 reference, and by tests/test_sensitivity.py).
"""

import dataclasses
from typing import Any, Callable, List

from tf_tempered.privacy import keras_bridge

__all__ = ["Handler", "Norms", "Step", "derived_weights", "describe_path", "handler_for", "lookup",
           "register", "registered"]


@dataclasses.dataclass(frozen=True)
class Step:
    """What a handler needs to know about the training step.

    num_microbatches: M (an int, or a scalar tensor when not known while tracing).
    examples_per_microbatch: E (an int, or None when the batch size is not static).
    options: the model's EngineOptions.
    batch_size: B (an int, or a scalar tensor when not known while tracing).
    """
    num_microbatches: Any
    examples_per_microbatch: Any
    options: Any
    batch_size: Any = None


@dataclasses.dataclass(frozen=True, eq=False)
class Norms:
    """A handler's result for one layer call.

    sq_norms: [M] squared norms of the microbatches' gradients of `variables`.
    clipped_sum: ClipWeights → [Σ_m c_m·g_m for each variable of `variables`,
      in that order] (a tensor, or tf.IndexedSlices for a sparse gradient).
    path: the path the handler took (its own frozen decision object), for
      inspection and tests.
    variables: the variables `clipped_sum` returns gradients for, when they are
      not `handler.variables(layer, params)` (multi_call: all the layer's own).
    """
    sq_norms: Any
    clipped_sum: Callable[[Any], List[Any]]
    path: Any = None
    variables: Any = None


class Handler:
    """Base class of the per-layer handlers (stateless: one instance per family)."""

    name = None  # short name for messages, logs and tests ("dense", "conv2d", ...)
    summary = None  # one line for the supported-layers table (supported_layers_markdown)

    # Whether recording bypasses the layer's activation so that the recorded
    # output is the pre-activation Z (the handler's math is for Z = f(A, W)).
    records_pre_activation = False

    # A per-example VJP of the layer's own recorded call (rnn.py): exact for any
    # subclass, so it also applies to subclasses that override `call`.
    vjp_of_own_call = False
    # Whether that VJP slices the tensors among the call's other arguments (mask,
    # initial states) per example too (generic.per_example_grads).
    slices_call_args = False
    # Whether the handler runs the layer's call itself (`recorded_call`, rnn_rows.py) to
    # record tensors of its own choosing instead of the layer's input and output.
    records_own_forward = False

    def hyperparameters(self, layer):
        """Plain values of `layer` the handler needs (a frozen dataclass or dict),
        or None if this handler does not cover this configuration."""
        raise NotImplementedError

    def variables(self, layer, params):
        """The trainable variables `norms(...).clipped_sum` returns gradients for, in order."""
        raise NotImplementedError

    def norms(self, call, params, step):
        """Norms for one recorded call (`call.inputs`, `call.grad_output`), see `Norms`."""
        raise NotImplementedError

    def recorded_call(self, layer, params, call_fn, inputs, args, kwargs, wrap):
        """(outputs, recorded inputs, recorded output) of a call the handler runs itself,
        with `wrap` applied to the recorded output before it is used; or None to leave
        the call to the next handler (only if records_own_forward)."""
        raise NotImplementedError

    def merge_calls(self, calls):
        """One call-like record for a layer called several times, or None (multi_call.py
        then sums per-example VJPs of the calls)."""
        del calls
        return None


_REGISTRY = {}  # layer class -> handler instance


def register(*layer_classes):
    """Class decorator: registers one instance of the Handler subclass for `layer_classes`."""
    def decorate(handler_class):
        handler = handler_class()
        for cls in layer_classes:
            _REGISTRY[cls] = handler
        return handler_class

    return decorate


def registered():
    """{layer class: handler} of every registered handler (a copy)."""
    return dict(_REGISTRY)


def handler_for(layer, skip=()):
    """The handler registered for the nearest class of `layer` whose `call` it inherits, or None.

    Walks the MRO: a registered class K applies only if it has the same `call`
    as the layer's class (else the layer computes something else than K), or if
    its handler is a VJP of the layer's own call (rnn.py, registered for RNN). Handlers
    in `skip` (they declined the layer) are passed over.
    """
    for cls in type(layer).__mro__:
        handler = _REGISTRY.get(cls)
        if handler is None or handler in skip:
            continue
        if handler.vjp_of_own_call or type(layer).call is cls.call:
            return handler
    return None


def derived_weights(layer):
    """Why `layer`'s weights are not the plain variables its handler's math is for, or None.

    Keras 3 layers with LoRA (`lora_rank`, `enable_lora`) compute their kernel
    (embeddings) from frozen weights plus trainable low-rank factors, and
    quantized ones from integer weights and scales: `layer.kernel` is then a
    tensor, not the trainable variable. A handler refuses such a layer
    (hyperparameters returns None) so that it takes the generic per-example VJP,
    which is exact for them. Keras 2 layers have neither.
    """
    if getattr(layer, "lora_enabled", False):
        return "LoRA is enabled (its trainable weights are the low-rank factors)"
    mode = getattr(layer, "quantization_mode", None)
    if mode:
        return f"it is quantized ({mode})"
    return None


def lookup(layer, skip=()):
    """(handler, plain hyperparameters) for `layer`; the generic handler where none applies.

    A handler that declines (hyperparameters None) passes the layer on to the handler of
    the next registered class in its MRO (an LSTM with dropout: from rnn_rows.py to the
    recurrent unit's rnn.py); `skip` lists handlers that declined a call already.

    A registered handler applies only if the variables it returns gradients for
    are exactly the layer's own trainable weights: otherwise (a Keras 3 variable
    frozen on its own, `layer.bias.trainable = False`; LoRA or quantized weights
    a handler missed) its norms would count a frozen variable or miss a
    trainable one, so the generic per-example VJP takes the layer.
    """
    skip = tuple(skip)
    while (handler := handler_for(layer, skip)) is not None:
        params = handler.hyperparameters(layer)
        if params is not None and _same_variables(handler.variables(layer, params),
                                                  keras_bridge.own_trainable_weights(layer)):
            return handler, params
        skip += (handler,)  # it declines this configuration: the next registered class's
    return GENERIC, GENERIC.hyperparameters(layer)


def describe_path(path):
    """A handler's path (Norms.path) as text: a string as is, a decision object as its
    repr with the choices made per step (tensors while tracing) shown as "per step".

    >>> from tf_tempered.privacy.layer_grads.rows import RowsPath
    >>> describe_path(RowsPath(materialize=False))
    'RowsPath(materialize=False)'
    """
    if path is None or isinstance(path, str):
        return path
    if dataclasses.is_dataclass(path):
        fields = ", ".join(f"{f.name}={_describe_value(getattr(path, f.name))}"
                           for f in dataclasses.fields(path))
        return f"{type(path).__name__}({fields})"
    return repr(path)


def _describe_value(value):
    if hasattr(value, "dtype") and hasattr(value, "shape"):  # a tensor: decided per step
        return "per step"
    if dataclasses.is_dataclass(value):
        return describe_path(value)
    if isinstance(value, (tuple, list)):
        return "(" + ", ".join(_describe_value(v) for v in value) + ")"
    return repr(value)


def _same_variables(ours, owned):
    keys = [keras_bridge.variable_key(v) for v in ours]
    return len(set(keys)) == len(keys) == len(owned) and set(keys) == {
        keras_bridge.variable_key(v) for v in owned}


# Handlers register themselves on import (after the definitions above).
# pylint: disable=g-import-not-at-top,wrong-import-position,unused-import
from tf_tempered.privacy.layer_grads import generic
from tf_tempered.privacy.layer_grads import dense
from tf_tempered.privacy.layer_grads import conv
from tf_tempered.privacy.layer_grads import conv1d
from tf_tempered.privacy.layer_grads import conv3d
from tf_tempered.privacy.layer_grads import conv_transpose
from tf_tempered.privacy.layer_grads import depthwise
from tf_tempered.privacy.layer_grads import separable
from tf_tempered.privacy.layer_grads import embedding
from tf_tempered.privacy.layer_grads import normalization
from tf_tempered.privacy.layer_grads import einsum_dense_handler
from tf_tempered.privacy.layer_grads import multi_call
from tf_tempered.privacy.layer_grads import rnn
from tf_tempered.privacy.layer_grads import rnn_rows
from tf_tempered.privacy.layer_grads import tempered_sigmoid
from tf_tempered.privacy.layer_grads import weight_standardized
# pylint: enable=g-import-not-at-top,wrong-import-position,unused-import

GENERIC = generic.GenericHandler()


def supported_layers_markdown():
    """The README's "Which layers are supported, and how" table, generated from the registry.

    >>> print(supported_layers_markdown().splitlines()[0])
    | Layer | Handler | How per-example gradient norms and the clipped sum are computed |
    """
    lines = ["| Layer | Handler | How per-example gradient norms and the clipped sum are computed |",
             "|---|---|---|"]
    for cls, handler in sorted(registered().items(), key=lambda item: item[0].__name__):
        lines.append(f"| `{cls.__name__}` | `{handler.name}` | {handler.summary} |")
    lines.append(f"| every other layer with trainable weights | `{GENERIC.name}` | "
                 f"{GENERIC.summary} |")
    lines.append(f"| a layer called more than once (shared weights) | `multi_call` | "
                 f"{multi_call.SUMMARY} |")
    lines.append("| refused, with the fix in the message | — | trainable BatchNormalization "
                 "(mixes examples), stateful RNNs, RNNs with dropout/recurrent_dropout, a "
                 "recurrent cell called outside an RNN layer, a layer inside another layer's "
                 "loop, a weight read outside its layer's calls (tied embeddings), weight "
                 "regularizers |")
    return "\n".join(lines)
