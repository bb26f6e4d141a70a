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
"""The handler registry: which handler computes a layer's per-example norms.

Registering a handler for class K applies it to layers of K and of subclasses
that inherit K's `call` unchanged (several handlers may register for one class, each
declining the configurations of the others: Dense and EinsumDense have a plain handler
and the LoRA one, lora.py); a subclass with its own `call` may compute
something else, so it takes the generic per-example VJP (generic.py), as do
unregistered layers and registered ones whose `hyperparameters` returns None
(a variant the handler does not cover, e.g. Conv2D with groups > 1). The engine never
branches on the layer type: it asks `lookup(layer)` for the handler.

Handlers register themselves when their module is imported; the package
``__init__`` imports them all.
"""

import dataclasses

from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import generic, multi_call
from tf_tempered.privacy.layer_grads.contract import NamedPath

__all__ = ["GENERIC", "describe_path", "handler_for", "lookup", "overridden_hook", "register",
           "register_named", "registered", "registered_all", "supported_layers_markdown"]

GENERIC = generic.GenericHandler()

_REGISTRY = {}  # layer class -> tuple of handler instances, tried in registration order
# Class name -> handlers registered for a layer class this Keras does not have (tf-keras'
# LocallyConnected1D/2D under Keras 3): listed in the supported-layers table all the same,
# so that the README's table is one text on both Kerases.
_ABSENT = {}


def register(*layer_classes):
    """Class decorator: registers one instance of the Handler subclass for `layer_classes`
    (after any handler registered for them before: the first that accepts a layer takes it)."""
    def decorate(handler_class):
        handler = handler_class()
        for cls in layer_classes:
            _REGISTRY[cls] = _REGISTRY.get(cls, ()) + (handler,)
        return handler_class

    return decorate


def register_named(namespace, *names):
    """`register` for the classes of `namespace` (e.g. keras.layers) called `names` that this
    Keras has; the others appear in the supported-layers table only."""
    def decorate(handler_class):
        present = [getattr(namespace, name) for name in names if hasattr(namespace, name)]
        register(*present)(handler_class)
        handler = _REGISTRY[present[0]][-1] if present else handler_class()
        for name in names:
            if not hasattr(namespace, name):
                _ABSENT[name] = _ABSENT.get(name, ()) + (handler,)
        return handler_class

    return decorate


def registered():
    """{layer class: handler} of every registered handler (a copy); a class with several
    handlers maps to the first (see `registered_all`)."""
    return {cls: handlers[0] for cls, handlers in _REGISTRY.items()}


def registered_all():
    """{layer class: tuple of its handlers, in the order they are tried} (a copy)."""
    return dict(_REGISTRY)


def handler_for(layer, skip=()):
    """The handler registered for the nearest class of `layer` whose `call` it inherits, or None.

    Walks the MRO: a registered class K applies only if it has the same `call`
    as the layer's class (else the layer computes something else than K), or if
    its handler is a VJP of the layer's own call (rnn.py, registered for RNN). Handlers
    in `skip` (they declined the layer) are passed over.
    """
    for cls in type(layer).__mro__:
        for handler in _REGISTRY.get(cls, ()):
            if handler in skip:
                continue
            if handler.vjp_of_own_call or (type(layer).call is cls.call
                                           and overridden_hook(type(layer), cls) is None):
                return handler
    return None


# Methods a subclass may override without changing what the registered class's call computes.
_OUTSIDE_THE_CALL = frozenset({
    "__init__", "build", "get_config", "from_config", "compute_output_shape",
    "compute_output_spec", "compute_mask", "get_build_config", "build_from_config",
    "save_own_variables", "load_own_variables", "__repr__", "__str__"})


def overridden_hook(layer_type, cls):
    """The name of a method or property of ``cls`` that a user's subclass between
    ``layer_type`` and ``cls`` overrides (Conv2D's ``convolution_op``, a ``kernel`` property
    computing a normalized kernel), or None. The registered class's call uses such hooks, so
    its handler's math would not be the layer's: the generic VJP of the layer's own call
    takes it instead. Classes of Keras and tf_tempered are trusted."""
    for sub in layer_type.__mro__:
        if sub is cls:
            return None
        if sub.__module__.split(".")[0] in ("keras", "tf_keras", "tf_tempered"):
            continue
        for name, value in vars(sub).items():
            if (name not in _OUTSIDE_THE_CALL and hasattr(cls, name)
                    and (callable(value) or isinstance(value, property))):
                return name
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
        hparams = handler.hyperparameters(layer)
        if hparams is not None and not dataclasses.is_dataclass(hparams):
            raise TypeError(f"Handler {handler.name!r} gave hyperparameters {hparams!r}: the "
                            "contract is a frozen dataclass (contract.NoHyperparameters if none).")
        if hparams is not None and _same_variables(handler.variables(layer, hparams),
                                                  keras_bridge.own_trainable_weights(layer)):
            return handler, hparams
        skip += (handler,)  # it declines this configuration: the next registered class's
    return GENERIC, GENERIC.hyperparameters(layer)


def describe_path(path):
    """A handler's path (LayerResult.path) as text: a string as is, a decision object as its
    repr with the choices made per step (tensors while tracing) shown as "per step".

    >>> from tf_tempered.privacy.layer_grads.rows import RowsPath
    >>> describe_path(RowsPath(materialize=False))
    'RowsPath(materialize=False)'
    """
    if path is None or isinstance(path, str):
        return path
    if isinstance(path, NamedPath):
        return path.name
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


def supported_layers_markdown():
    """The README's "Which layers are supported, and how" table, generated from the registry.

    >>> print(supported_layers_markdown().splitlines()[0])
    | Layer | Handler | How per-example gradient norms and the clipped sum are computed |
    """
    lines = ["| Layer | Handler | How per-example gradient norms and the clipped sum are computed |",
             "|---|---|---|"]
    named = [(cls.__name__, handlers) for cls, handlers in registered_all().items()]
    for name, handlers in sorted(named + list(_ABSENT.items()), key=lambda item: item[0]):
        for handler in handlers:
            lines.append(f"| `{name}` | `{handler.name}` | {handler.summary} |")
    lines.append(f"| every other layer with trainable weights | `{GENERIC.name}` | "
                 f"{GENERIC.summary} |")
    lines.append(f"| a layer called more than once (shared weights) | `multi_call` | "
                 f"{multi_call.SUMMARY} |")
    lines.append("| refused, with the fix in the message | — | a trainable BatchNormalization "
                 "in training mode (mixes examples), stateful RNNs, RNNs with dropout/recurrent_dropout, a "
                 "recurrent cell called outside an RNN layer, a layer inside another layer's "
                 "loop, a weight read outside its layer's calls (tied embeddings), weight "
                 "regularizers |")
    return "\n".join(lines)
