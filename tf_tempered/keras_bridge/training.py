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
"""Keras internals about training: XLA, ``fit``'s arguments, saving, the wrapped optimizer
(loss scaling and the guard of every update: optimizers.py)."""

import contextlib
import inspect

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["activity_regularized_layers", "class_registered_as", "fit_arguments",
           "inner_optimizer", "jit_compiled", "serialize_as", "steps_per_execution",
           "suspended_activity_regularizers", "swap_class", "deserialize", "has_compiled_loss",
           "reduction_method_is_default", "overriding_class", "update_metrics_state",
           "save_compiled_optimizer_object", "callbacks_as_list"]

IS_KERAS3 = KERAS_MAJOR == 3


def overriding_class(model, name):
    """The name of the class that gives ``model`` its own method ``name`` in place of
    ``keras.Model``'s (Keras' guide "Customizing what happens in fit()"), or None. The
    function decides, not where it is defined: Keras' own assigned in a subclass is not an
    override."""
    code = getattr(getattr(type(model), name, None), "__code__", None)
    if code is None or code is getattr(getattr(keras.Model, name), "__code__", None):
        return None
    return next(c.__name__ for c in type(model).__mro__ if name in vars(c))


def update_metrics_state(model, x, y, y_pred, sample_weight):
    """Updates the compiled metrics with a batch, inside a loop (results read after it).

    ``model.compute_metrics`` also reads the results; TF-Keras' ``Metric.result()`` merges
    the replicas (merge_call), which a strategy refuses inside control flow, so under a
    strategy with several replicas Keras 2's compiled metrics are updated directly.
    """
    if IS_KERAS3 or tf.distribute.get_strategy().num_replicas_in_sync == 1:
        model.compute_metrics(x, y, y_pred, sample_weight)
    else:
        model.compiled_metrics.update_state(y, y_pred, sample_weight)


def inner_optimizer(optimizer):
    """The optimizer a LossScaleOptimizer wraps (mixed_float16), else ``optimizer`` itself.

    The DP engine computes its update in float32 from a loss it does not scale, so
    it applies the update with the wrapped optimizer: the loss-scale optimizer would
    divide it by a loss scale it never multiplied in.
    """
    while optimizer is not None and hasattr(optimizer, "inner_optimizer"):
        optimizer = optimizer.inner_optimizer
    return optimizer


def jit_compiled(model):
    """Whether Keras compiles the model's train function with XLA (``jit_compile``).

    Keras 3 resolves ``jit_compile="auto"`` (its default) to True on a machine with a
    GPU, so every DP path must be XLA-compilable.
    """
    value = model.jit_compile if IS_KERAS3 else getattr(model, "_jit_compile", False)
    return bool(value)


def has_compiled_loss(model):
    """Whether ``model`` was compiled with a loss (Keras 2 ``compiled_loss``, 3 ``_compile_loss``)."""
    return (getattr(model, "compiled_loss", None) is not None
            or getattr(model, "_compile_loss", None) is not None)


def reduction_method_is_default(model):
    """Whether ``model.distribute_reduction_method`` was left unset (tf-keras: "auto")."""
    return getattr(model, "_distribute_reduction_method", None) is None


def steps_per_execution(model):
    """Training steps Keras runs per call of its train function (1 by default)."""
    value = getattr(model, "steps_per_execution", None)
    if value is None:
        value = getattr(model, "_steps_per_execution", None)
    return 1 if value is None else int(value.numpy() if hasattr(value, "numpy") else value)


def fit_arguments(model, args, kwargs):
    """``Model.fit``'s arguments of this Keras by name, defaults filled in (a dict).

    A model class's own ``fit`` names them; one that passes ``*args, **kwargs`` through
    (to add callbacks, say) is called with Keras' names, and keywords of its own are kept.
    """
    signature = inspect.signature(type(model).fit)
    own = {}
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in signature.parameters.values()):
        signature = inspect.signature(keras.Model.fit)
        own = {k: v for k, v in kwargs.items() if k not in signature.parameters}
        kwargs = {k: v for k, v in kwargs.items() if k in signature.parameters}
    bound = signature.bind(model, *args, **kwargs)
    bound.apply_defaults()
    arguments = dict(bound.arguments)
    del arguments["self"]
    extra = arguments.pop("kwargs", None)
    if extra:
        arguments.update(extra)
    arguments.update(own)
    return arguments


def save_compiled_optimizer_object(model):
    """Makes the model's compile config, which its ``.keras`` file stores, hold its optimizer
    object (the marked one) rather than the string ``compile`` was given.

    tf-keras keeps ``compile``'s own arguments (``optimizer="sgd"``) and its ``.keras``
    loader compiles a fresh, plain optimizer from them: the model's DP settings and
    ledger would be lost and it would train without DP. Keras 3 stores the object already.
    """
    config = getattr(model, "_compile_config", None)
    if IS_KERAS3 or config is None or not isinstance(getattr(config, "config", None), dict):
        return
    if isinstance(config.config.get("optimizer"), (str, dict)):  # a name or a config
        config.config["optimizer"] = model.optimizer


def swap_class(obj, cls):
    """Makes ``obj`` an instance of ``cls`` (a subclass or base of its class, same layout)."""
    object.__setattr__(obj, "__class__", cls)


def class_registered_as(cls, registered_name):
    """Keras serializes instances of ``cls`` under ``registered_name`` ("package>Name"),
    which must name a class registered with ``register_keras_serializable``."""
    if IS_KERAS3:
        from keras.src.saving import object_registration  # pylint: disable=g-import-not-at-top
        object_registration.GLOBAL_CUSTOM_NAMES[cls] = registered_name
    else:
        from tf_keras.src.saving import object_registration  # pylint: disable=g-import-not-at-top
        object_registration._GLOBAL_CUSTOM_NAMES[cls] = registered_name  # pylint: disable=protected-access


def serialize_as(obj, cls):
    """Keras' serialization of the optimizer ``obj`` as if it were an instance of ``cls``."""
    actual = type(obj)
    swap_class(obj, cls)
    try:
        if IS_KERAS3:
            return keras.saving.serialize_keras_object(obj)
        # tf-keras' own form for optimizers in every format (H5, SavedModel, .keras):
        # the registered name ("package>Name" for custom classes) and the config.
        return {"class_name": keras.utils.get_registered_name(cls), "config": obj.get_config()}
    finally:
        swap_class(obj, actual)


def deserialize(config):
    """The object Keras' serialization ``config`` describes (an optimizer here)."""
    if IS_KERAS3:
        return keras.saving.deserialize_keras_object(config)
    return keras.optimizers.deserialize(config)


def activity_regularized_layers(layers):
    """The layers among ``layers`` that have an activity regularizer."""
    return [layer for layer in layers if getattr(layer, "activity_regularizer", None) is not None]


def _set_activity_regularizer(layer, value):
    name = "activity_regularizer" if IS_KERAS3 else "_activity_regularizer"
    object.__setattr__(layer, name, value)


@contextlib.contextmanager
def suspended_activity_regularizers(layers):
    """Inside the block, Keras adds no activity-regularization loss for ``layers``
    (the DP engine folds each example's penalty into its own loss instead)."""
    saved = [(layer, layer.activity_regularizer) for layer in layers]
    for layer, _ in saved:
        _set_activity_regularizer(layer, None)
    try:
        yield
    finally:
        for layer, regularizer in saved:
            _set_activity_regularizer(layer, regularizer)


def callbacks_as_list(callbacks):
    """``fit``'s ``callbacks`` as a list: None, a list, or a CallbackList (Keras 3's is not
    iterable; its callbacks are in ``.callbacks``)."""
    if callbacks is None:
        return []
    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    return list(callbacks)
