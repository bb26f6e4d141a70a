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
"""Keras internals about training: optimizers, XLA, ``fit``'s arguments, saving."""

import contextlib
import inspect
import threading

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["activity_regularized_layers", "class_registered_as", "fit_arguments",
           "inner_optimizer", "jit_compiled", "serialize_as", "steps_per_execution",
           "suspended_activity_regularizers", "swap_class", "deserialize", "has_compiled_loss",
           "reduction_method_is_default", "overriding_class", "update_metrics_state",
           "save_compiled_optimizer_object", "guard_optimizer_updates",
           "loss_scale_factor", "loss_scale_divisor", "callbacks_as_list"]

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


_GUARDS = []


def loss_scale_factor(optimizer):
    """Keras 3's ``loss_scale_factor`` of an optimizer (its apply divides the gradients by
    it), or None (unset, or tf-keras, whose optimizers have none)."""
    return getattr(optimizer, "loss_scale_factor", None) if IS_KERAS3 else None


def loss_scale_divisor(optimizer):
    """What Keras 3's ``apply`` of ``optimizer`` divides the gradients by, as a scalar (a
    LossScaleOptimizer's dynamic scale, times the wrapped optimizer's ``loss_scale_factor``;
    an optimizer's own ``loss_scale_factor``), or None: nothing (tf-keras' LossScaleOptimizer
    leaves the unscaling to ``get_unscaled_gradients``)."""
    if not IS_KERAS3:
        return None
    divisor = None
    if hasattr(optimizer, "inner_optimizer") and hasattr(optimizer, "initial_scale"):
        divisor = optimizer.dynamic_scale if optimizer.built else optimizer.initial_scale
        optimizer = optimizer.inner_optimizer
    factor = loss_scale_factor(optimizer)
    if factor is None:
        return divisor
    return factor if divisor is None else tf.cast(divisor, tf.float32) * factor


def guard_optimizer_updates(check):
    """Makes every Keras optimizer call ``check(optimizer, variables, grads)`` before it
    updates ``variables`` (Keras 3's ``apply``, tf-keras' ``apply_gradients`` of both
    optimizer families, and TF 1's ``tf.compat.v1.train`` optimizers'); ``check`` raises to refuse, else returns ``(ops, grads)``: ops the
    update then runs after (checks at run time of a traced update) and the gradients it
    applies (as given, or carrying a check where XLA drops ops). An optimizer's update inside
    another's (a LossScaleOptimizer's inner one, on the gradients it unscaled) is the outer
    one's, checked once. Installed once; checks run while tracing."""
    if _GUARDS:
        return
    _GUARDS.append(check)
    # TF 1's optimizers (tf.compat.v1.train.*) update variables too (probe S, F8: unchecked).
    v1_optimizer = tf.compat.v1.train.Optimizer
    v1_optimizer.apply_gradients = _guarded_apply_gradients(v1_optimizer.apply_gradients, check)
    if IS_KERAS3:
        from keras.src.optimizers import base_optimizer  # pylint: disable=g-import-not-at-top
        from keras.src.optimizers import loss_scale_optimizer  # pylint: disable=g-import-not-at-top
        # The LossScaleOptimizer's own apply (it overrides it) sees the gradients as given.
        for cls in (base_optimizer.BaseOptimizer, loss_scale_optimizer.LossScaleOptimizer):
            cls.apply = _guarded_apply(cls.apply, check)
        return
    from tf_keras.src.optimizers import optimizer as new_optimizer  # pylint: disable=g-import-not-at-top
    from tf_keras.src.optimizers.legacy import optimizer_v2  # pylint: disable=g-import-not-at-top
    from tf_keras.src.mixed_precision import loss_scale_optimizer  # pylint: disable=g-import-not-at-top
    from tf_keras.src.optimizers import optimizer_v1  # pylint: disable=g-import-not-at-top
    # (TFOptimizer: compile(optimizer=tf.compat.v1.train.X) wraps X; its update is X's.)
    for cls in (new_optimizer.Optimizer, optimizer_v2.OptimizerV2,
                loss_scale_optimizer.LossScaleOptimizer,
                loss_scale_optimizer.LossScaleOptimizerV3, optimizer_v1.TFOptimizer):
        if "apply_gradients" in vars(cls):
            cls.apply_gradients = _guarded_apply_gradients(cls.apply_gradients, check)


def _guarded_apply(apply, check):
    def guarded(self, grads, trainable_variables=None):
        grads = list(grads)
        variables = (list(trainable_variables) if trainable_variables is not None
                     else list(getattr(self, "_trainable_variables", None) or []))
        with _outermost() as outermost:
            before, grads = check(self, variables, grads) if outermost else ([], grads)
            with tf.control_dependencies(before):
                return apply(self, grads, variables if trainable_variables is not None else None)
    return guarded


def _guarded_apply_gradients(apply_gradients, check):
    def guarded(self, grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)  # (often a zip: read once)
        with _outermost() as outermost:
            if outermost:
                variables = [v for _, v in grads_and_vars]
                before, grads = check(self, variables, [g for g, _ in grads_and_vars])
                grads_and_vars = list(zip(grads, variables))
            else:
                before = []
            with tf.control_dependencies(before):
                return apply_gradients(self, grads_and_vars, *args, **kwargs)
    return guarded


_NESTING = threading.local()


@contextlib.contextmanager
def _outermost():
    """Yields whether this optimizer update is not inside another's (per thread)."""
    depth = getattr(_NESTING, "depth", 0)
    _NESTING.depth = depth + 1
    try:
        yield depth == 0
    finally:
        _NESTING.depth = depth


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
