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
"""Which optimizers may update a private model's weights: no update without DP.

make_private tags the model's weights (and those built later, before any update). A Keras
optimizer then refuses to update a tagged weight (NotPrivateError, naming the fix) unless

* it is the model's own optimizer (marked, :mod:`~tf_tempered.privacy.saving`), which
  applies only the DP step's update (``fit``, ``train_on_batch``), or
* a :class:`~tf_tempered.privacy.DPGradients` was made for the model and the gradients
  are the ones it returned (:mod:`~tf_tempered.privacy.dp_outputs`): a custom loop
  applies its DP gradients with an optimizer of its own.

So a ``GradientTape`` loop that applies a private model's raw gradients (with or without
a DPGradients for it), or a plain model built around a private model's layers, is refused
instead of training them without clipping or noise. What it cannot see: weights assigned
directly (not by a Keras optimizer), and a raw gradient added to a DP one inside a
``tf.function``. The check runs where Keras' optimizers update (once per trace in a
``tf.function``); a plain update traced before make_private fails at run time once the
model is private (an assertion it runs after, _fail_once_private); weights of a model
loaded from a private one are refused the same way until make_private
(saving.refuse_loaded_updates).

>>> from tf_tempered._compat import keras
>>> from tf_tempered.privacy import make_private
>>> model = make_private(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
...                      l2_norm_clip=1.0, noise_multiplier=1.1)
>>> keras.optimizers.SGD(0.1).apply_gradients(
...     [(v * 0.0, v) for v in model.trainable_variables])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
tf_tempered.privacy.errors.NotPrivateError: The optimizer SGD would update the weights ...
"""

import warnings
import weakref

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy import dp_outputs, saving, shared_ledgers
from tf_tempered.privacy.errors import NotPrivateError

__all__ = ["tag_private_weights", "allow_dp_gradient_loops", "refuse_updates_without_dp",
           "is_private_weight", "fail_traced_plain_updates"]

_TAG = "_tf_tempered_private"  # on a private model's weights: who may update them
_OWN_STEP = "own DP step"        # only the model's own optimizer (fit, train_on_batch)
_DP_LOOPS = "DPGradients loops"  # also any optimizer of a DPGradients loop
_TRACED_PLAIN = "_tf_tempered_traced_plain"  # on a weight: flags of plain traced updates


def _tag(variable):
    return vars(variable).get(_TAG) if hasattr(variable, "__dict__") else None


def is_private_weight(variable):
    """Whether ``variable`` is a private model's weight (tagged by make_private)."""
    return _tag(variable) is not None


def tag_private_weights(model):
    """Tags the weights ``model`` holds (trainable or not: they may be unfrozen later)."""
    _tag_all(model, [v for v in keras_bridge.existing_weights(model) if _tag(v) is None],
             _OWN_STEP)


def allow_dp_gradient_loops(model):
    """A DPGradients was made for ``model``: a loop's own optimizer may apply its gradients."""
    _tag_all(model, keras_bridge.existing_weights(model), _DP_LOOPS)


def _tag_all(model, variables, who):
    """Tags ``variables`` as updated by ``who`` only, and fails the plain updates of them
    traced before (_fail_once_private), warning when a loop's optimizer traced them (not
    the model's own: make_private drops the step its fit traced)."""
    for alias in (a for variable in variables for a in keras_bridge.variable_aliases(variable)):
        keras_bridge.set_untracked(alias, _TAG, who)
    own = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
    traced = [(optimizer, in_fit) for optimizer, in_fit in fail_traced_plain_updates(variables)
              if optimizer is not own or not in_fit]
    loops = sorted({type(optimizer).__name__ for optimizer, in_fit in traced if not in_fit})
    fits = sorted({type(optimizer).__name__ for optimizer, in_fit in traced if in_fit})
    # at make_private's caller
    if loops:
        warnings.warn(_TRACED_BEFORE_WARNING.format(names=", ".join(loops)), stacklevel=5)
    elif fits:  # another model's fit, e.g. the plain one these layers were pre-trained in
        warnings.warn(_FIT_OF_ANOTHER_MODEL.format(names=", ".join(fits)), stacklevel=5)


def fail_traced_plain_updates(variables):
    """Sets the flags of the plain updates of ``variables`` traced so far in a tf.function
    (_fail_once_private): called again, they fail instead of training the variables, which
    are private now (tagged by make_private, or loaded from a private model's weights).
    Returns (optimizer, traced by a fit) for each of those updates whose optimizer lives."""
    traced = []
    for alias in (a for variable in variables for a in keras_bridge.variable_aliases(variable)):
        for flag, optimizer, in_fit in vars(alias).get(_TRACED_PLAIN, ()):
            flag.assign(1.0)
            if optimizer() is not None and (optimizer(), in_fit) not in traced:
                traced.append((optimizer(), in_fit))
        keras_bridge.set_untracked(alias, _TRACED_PLAIN, ())
    return traced


def refuse_updates_without_dp(optimizer, variables, grads=()):
    """The optimizer guard (keras_bridge.guard_optimizer_updates), before every update."""
    if saving.is_marked(optimizer):
        return [], grads  # it refuses by itself unless the DP engine marked the update
    for model in shared_ledgers.private_models():
        tag_private_weights(model)  # weights built since make_private (no Input: first call)
    saving.refuse_loaded_updates(optimizer, variables)
    if any(_tag(variable) == _OWN_STEP for variable in variables):
        raise NotPrivateError(_REFUSAL.format(name=type(optimizer).__name__))
    raw = [variable for grad, variable in zip(grads, variables)
           if _tag(variable) == _DP_LOOPS and not dp_outputs.came_from_dp(grad)]
    if raw:
        raise NotPrivateError(_RAW_IN_LOOP.format(name=type(optimizer).__name__,
                                                  variable=raw[0].name))
    grads = _applied_as_returned(optimizer, variables, grads)
    return _fail_once_private(optimizer, [v for v in variables if _tag(v) is None], grads)


def _applied_as_returned(optimizer, variables, grads):
    """Keras 3's apply divides the gradients by a LossScaleOptimizer's scale and by a
    ``loss_scale_factor``: right for the gradients of a loss they scaled, but DPGradients'
    ĝ is no such gradient (it was 1/32768 of the DP update, silently, in Keras' mixed-
    precision loop). Multiplied by the divisor, ĝ is applied as returned, as fit applies it
    (step/update.py)."""
    divisor = keras_bridge.loss_scale_divisor(optimizer)
    if divisor is None:
        return grads

    def scaled(grad):
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(scaled(grad.values), grad.indices, grad.dense_shape)
        grad = tf.convert_to_tensor(grad)
        return grad * tf.cast(divisor, grad.dtype)

    return [scaled(grad) if grad is not None and _tag(variable) == _DP_LOOPS else grad
            for grad, variable in zip(grads, variables)]


def _fail_once_private(optimizer, plain, grads):
    """Inside a tf.function, an update of weights no make_private has tagged: an assertion
    the update runs after, failing once make_private tags one of them. The check above runs
    only while tracing, so a training step traced before make_private (a tape loop run once
    on the plain model) would keep applying its update without DP. One flag per traced
    update, kept on each weight it updates (a read of one scalar per step; under a
    tf.distribute strategy each replica reads it). XLA drops assertions: a step compiled
    with jit_compile=True, and a plain step traced without it and called later inside such
    a step, so the gradients carry the flag too, NaN once it is set (_nan_once_flagged).
    make_private also warns of a loop that traced an update of its weights (_tag_all).
    Returns (ops to run before the update, the gradients to apply)."""
    if not plain or not tf.inside_function():
        return [], grads
    owner = keras_bridge.inner_optimizer(optimizer)
    flag = keras_bridge.flag_variable("tf_tempered_traced_before_private", owner)
    # make_private drops the step a fit traced: only a loop's traced update of the model's own
    # optimizer is worth a warning (_tag_all).
    traced = (flag, weakref.ref(owner), keras_bridge.traced_by_a_fit())
    for variable in plain:
        keras_bridge.set_untracked(variable, _TRACED_PLAIN,
                                   vars(variable).get(_TRACED_PLAIN, ()) + (traced,))
    # Not under XLA: it would drop the assertion, logging so at every compile of a plain step.
    checks = ([] if keras_bridge.in_xla_context()
              else [tf.debugging.Assert(tf.equal(flag, 0.0), [_TRACED_BEFORE])])
    return checks, _nan_once_flagged(grads, flag)


def _nan_once_flagged(grads, flag):
    """``grads`` + (NaN if flag else 0): once make_private has tagged a weight of this
    update, it writes NaN into the weights (the loss turns NaN) instead of training them
    without DP where the assertion does not run (XLA has no run-time error to raise). One
    add per gradient: XLA fuses it into the update; under TF's executor MobileNetV2's 158
    gradients (2.2 M values) take 1.2 ms more, against a step of about 120 ms on this
    project's CPU (2026-12-06).

    >>> flag = tf.Variable(0.0)
    >>> [g.numpy().tolist() for g in _nan_once_flagged([tf.constant([1.0, 2.0]), None], flag)
    ...  if g is not None]
    [[1.0, 2.0]]
    >>> _ = flag.assign(1.0)
    >>> _nan_once_flagged([tf.constant([1.0, 2.0])], flag)[0].numpy().tolist()
    [nan, nan]
    """
    poison = tf.where(flag > 0.0, float("nan"), 0.0)

    def carried(grad):
        if grad is None:
            return None
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values + tf.cast(poison, grad.values.dtype),
                                    grad.indices, grad.dense_shape)
        grad = tf.convert_to_tensor(grad)
        return grad + tf.cast(poison, grad.dtype)

    return [carried(grad) for grad in grads]


_REFUSAL = (
    "The optimizer {name} would update the weights of a private model (make_private) with "
    "gradients the DP engine did not compute: WITHOUT differential privacy (no clipping, "
    "no noise) and outside its ε. Fix: train the model with its own fit (or "
    "train_on_batch); in a custom loop, take the gradients from "
    "tf_tempered.privacy.DPGradients(model, loss, l2_norm_clip=..., noise_multiplier=...) "
    "(docs/custom_loops.md); a model built around a private model's layers: make it "
    "private too (make_private(outer_model, ...)). " + saving.PUBLIC_COPY_FIX)


_TRACED_BEFORE = (
    "NotPrivateError: this tf.function was traced before make_private (or before load_weights "
    "loaded a private model's weights) and updates weights that are private since: it would "
    "train them WITHOUT differential privacy (no clipping, no noise) and outside its ε. Fix: "
    "define the training step again after make_private(model) and take its gradients from "
    "tf_tempered.privacy.DPGradients(model, loss, ...) (docs/custom_loops.md), or train with "
    "the model's own fit.")


_TRACED_BEFORE_WARNING = (
    "make_private: a tf.function traced before it updates this model's weights with "
    "{names} (a training loop run on the plain model). Called again, it raises "
    "InvalidArgumentError instead of training them without differential privacy (compiled "
    "with jit_compile=True, or called inside such a step, where XLA raises no error, it "
    "writes NaN into them instead). "
    "Fix: define the training step again after "
    "make_private, taking its gradients from tf_tempered.privacy.DPGradients "
    "(docs/custom_loops.md), or train with the model's own fit.")


_FIT_OF_ANOTHER_MODEL = (
    "make_private: another model's fit traced before it also updates these weights (with "
    "{names}): a model sharing these layers, e.g. the plain one they were pre-trained in. "
    "That fit now raises InvalidArgumentError instead of training them without differential "
    "privacy. Nothing to do if that model is done training; to train it on, give it copies "
    "of the weights (build it anew, then set_weights).")


_RAW_IN_LOOP = (
    "The optimizer {name} would update {variable!r}, a weight of a model with a "
    "DPGradients, with a gradient DPGradients did not return: WITHOUT differential privacy "
    "(no clipping, no noise) and outside its ε. Fix: apply the gradients "
    "DPGradients(model, ...)(x, y) returns, as returned (grads, logs = dp(x, y); "
    "optimizer.apply_gradients(zip(grads, model.trainable_variables))), not tape.gradient's; "
    "transform them inside a tf.function or through the optimizer's own options "
    "(clipnorm, weight_decay, a LossScaleOptimizer).")


keras_bridge.guard_optimizer_updates(refuse_updates_without_dp)
