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
"""Keras internals about optimizers' updates: what Keras 3's ``apply`` divides the gradients
by (loss scaling), and the guard every Keras or TF 1 optimizer update passes first.

>>> loss_scale_divisor(keras.optimizers.SGD(0.1)) is None  # no loss scaling
True
"""

import contextlib
import threading

from tf_tempered._compat import KERAS_MAJOR, keras, tf  # noqa: F401  (keras: the doctest)

__all__ = ["guard_optimizer_updates", "loss_scale_divisor", "loss_scale_factor"]

IS_KERAS3 = KERAS_MAJOR == 3


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
