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
"""DP optimizers with TF Privacy's names and arguments, for the fast DP engine.

``DPKerasSGDOptimizer``, ``DPKerasAdamOptimizer`` and ``DPKerasAdagradOptimizer``
take TF Privacy's constructor arguments (``l2_norm_clip``, ``noise_multiplier``,
``num_microbatches``, then the base optimizer's keyword arguments) and subclass the
active Keras' own optimizer: on Keras 2 the same legacy optimizers TF Privacy's
classes do (``tf_keras.optimizers.legacy.SGD``, ``Adam``, ``Adagrad``), so the update
rule is identical; on Keras 3 ``keras.optimizers.SGD``, ``Adam``, ``Adagrad``
(TF Privacy has no Keras 3 optimizers). A TF Privacy tutorial ports by changing one
import; TensorFlow Privacy need not be installed (it does not install on Python 3.12+).
``tf_tempered.make_private(model, l2_norm_clip=..., noise_multiplier=...)`` is the
other way: then any Keras optimizer (AdamW, schedules, ...) does the update.

These optimizers only carry the DP settings: the clipping and the noise are done by
:func:`tf_tempered.make_private`'s training step. A model compiled with one of them
but not prepared by ``make_private`` would train without privacy, so their gradient
computation (``minimize``, ``get_gradients``) refuses, and ``apply_gradients``
(Keras 3: ``apply``) refuses unless the DP engine marked the call (it sets ``_was_dp_gradients_called``,
the flag TF Privacy's optimizers use, just before each ``apply_gradients``; the
mark is consumed by that call).

Example:

>>> import numpy as np
>>> import tf_tempered
>>> from tf_tempered._compat import KERAS_MAJOR, keras
>>> from tf_tempered.privacy import DPKerasSGDOptimizer
>>> model = tf_tempered.make_private(
...     keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]))
>>> model.compile(
...     optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
...                                   learning_rate=0.1),
...     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
>>> history = model.fit(np.zeros((8, 4)), np.zeros(8), batch_size=4, verbose=0)
>>> tf_tempered.privacy.dp_config(model.optimizer)
DPConfig(l2_norm_clip=1.0, noise_multiplier=1.1, num_microbatches=None)
"""

import math
import numbers

from tf_tempered._compat import KERAS_MAJOR, keras

__all__ = ["DPKerasSGDOptimizer", "DPKerasAdamOptimizer", "DPKerasAdagradOptimizer",
           "DPOptimizerMixin", "NOT_PRIVATE_MESSAGE"]

NOT_PRIVATE_MESSAGE = (
    "{cls} only carries DP-SGD settings; the clipping and the noise are done by "
    "tf_tempered's DP training step, and this update is not one of it (a model not "
    "prepared for it, or a loop of your own), so it would train WITHOUT differential "
    "privacy. Fix: call tf_tempered.make_private(model) before compile/fit (for example "
    "`model = tf_tempered.make_private(model)`, then `model.compile(optimizer={cls}(...), "
    "loss=...)`); in a loop of your own, take the gradients from "
    "tf_tempered.privacy.DPGradients(model, loss, l2_norm_clip=..., noise_multiplier=...) "
    "and apply them with a plain Keras optimizer (e.g. keras.optimizers.SGD), not {cls} "
    "(docs/custom_loops.md).")

_PRIVACY_ARGS = ("l2_norm_clip", "noise_multiplier", "num_microbatches")


def _check_l2_norm_clip(value):
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or not value > 0):
        raise ValueError(
            f"l2_norm_clip must be a finite number > 0 (the largest L2 norm a "
            f"microbatch's gradient may keep), got {value!r}. Fix: pass e.g. "
            "l2_norm_clip=1.0.")
    return float(value)


def _check_noise_multiplier(value):
    if (isinstance(value, bool) or not isinstance(value, numbers.Real)
            or not math.isfinite(value) or not value >= 0):
        raise ValueError(
            f"noise_multiplier must be a finite number >= 0 (noise stddev / "
            f"l2_norm_clip), got {value!r}. Fix: pass e.g. noise_multiplier=1.1, or "
            "tf_tempered.privacy.noise_multiplier_for_epsilon(...) for a target ε.")
    return float(value)


def _check_num_microbatches(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(
            f"num_microbatches must be None (one example per microbatch) or a positive "
            f"int that divides the batch size, got {value!r}. Fix: pass "
            "num_microbatches=None or e.g. num_microbatches=4 with a batch size that is a "
            "multiple of 4.")
    return int(value)


class DPOptimizerMixin:
    """DP-SGD settings on a Keras optimizer; the update rule is the base's.

    Subclasses are the ``DPKeras*Optimizer`` classes of this module. Constructor:
    ``(l2_norm_clip, noise_multiplier, num_microbatches=None, **base_kwargs)``,
    in TF Privacy's order; the base optimizer's arguments (``learning_rate``, ...)
    are keyword-only.
    """

    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *,
                 gradient_accumulation_steps=None, **kwargs):
        if gradient_accumulation_steps not in (None, 1):
            raise ValueError(
                f"gradient_accumulation_steps={gradient_accumulation_steps!r} is not "
                f"supported by {type(self).__name__}. Fix: leave it at 1 and use a larger "
                "batch size (Poisson batches: tf_tempered.privacy.poisson_batches).")
        # Validated before the base is built; set after (Keras 3 optimizers refuse
        # attributes set before their __init__).
        settings = (_check_l2_norm_clip(l2_norm_clip), _check_noise_multiplier(noise_multiplier),
                    _check_num_microbatches(num_microbatches))
        super().__init__(**kwargs)
        self._l2_norm_clip, self._noise_multiplier, self._num_microbatches = settings
        # TF Privacy's flag; here a one-call mark set by the DP engine's train step.
        self._was_dp_gradients_called = False

    @property
    def l2_norm_clip(self):
        """The clip norm C of each microbatch's gradient."""
        return self._l2_norm_clip

    @property
    def noise_multiplier(self):
        """σ: the noise added to the sum of clipped gradients has stddev σ·C."""
        return self._noise_multiplier

    @property
    def num_microbatches(self):
        """Microbatches per batch; None means one example per microbatch."""
        return self._num_microbatches

    @property
    def noise_stddev(self):
        """σ·C, computed as TF Privacy's GaussianSumQuery does."""
        return self._l2_norm_clip * self._noise_multiplier

    def _refuse(self):
        raise RuntimeError(NOT_PRIVATE_MESSAGE.format(cls=type(self).__name__))

    def _consume_dp_mark(self):
        if not self._was_dp_gradients_called:
            self._refuse()
        self._was_dp_gradients_called = False  # one mark, one call

    def get_config(self):
        config = super().get_config()
        config.update({"l2_norm_clip": self._l2_norm_clip,
                       "noise_multiplier": self._noise_multiplier,
                       "num_microbatches": self._num_microbatches})
        return config


class _Keras2Refusals:
    """Keras 2 legacy optimizers: where a non-private step would compute or apply gradients."""

    def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
        """Refuses: Keras' own (non-private) train step computes gradients here."""
        del loss, var_list, grad_loss, tape
        self._refuse()

    def get_gradients(self, loss, params):
        """Refuses: non-private graph-mode gradients."""
        del loss, params
        self._refuse()

    def apply_gradients(self, grads_and_vars, name=None, **kwargs):
        """Applies DP gradients handed over by tf_tempered's DP train step; else refuses."""
        self._consume_dp_mark()
        return super().apply_gradients(grads_and_vars, name=name, **kwargs)


class _Keras3Refusals:
    """Keras 3 optimizers: every update (``apply_gradients``, ``Model.train_step``) goes
    through ``apply``."""

    def apply(self, grads, trainable_variables=None):
        """Applies DP gradients handed over by tf_tempered's DP train step; else refuses."""
        self._consume_dp_mark()
        return super().apply(grads, trainable_variables)


if KERAS_MAJOR == 3:
    _Refusals = _Keras3Refusals
    _BASES = {"SGD": keras.optimizers.SGD, "Adam": keras.optimizers.Adam,
              "Adagrad": keras.optimizers.Adagrad}
    _BASE_PATH = "keras.optimizers"
else:
    _Refusals = _Keras2Refusals
    _BASES = {"SGD": keras.optimizers.legacy.SGD, "Adam": keras.optimizers.legacy.Adam,
              "Adagrad": keras.optimizers.legacy.Adagrad}
    _BASE_PATH = "tf_keras.optimizers.legacy"


def _doc(base):
    return f"""DP-SGD settings on ``{_BASE_PATH}.{base}`` (TF Privacy's name and arguments).

    Args:
      l2_norm_clip: clip norm C (> 0) of each microbatch's gradient.
      noise_multiplier: σ (≥ 0); the sum of clipped gradients gets N(0, (σ·C)²) noise.
      num_microbatches: None (one example per microbatch) or a positive int that
        divides the batch size.
      **kwargs: keyword arguments of ``{_BASE_PATH}.{base}``
        (``learning_rate=...``, ...).

    Use it with :func:`tf_tempered.make_private` (which does the clipping and noise);
    without it, training raises instead of running non-privately.

    >>> opt = DPKeras{base}Optimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
    ...                             learning_rate=0.1)
    >>> (opt.l2_norm_clip, opt.noise_multiplier, opt.num_microbatches)
    (1.0, 1.1, None)
    >>> DPKeras{base}Optimizer.from_config(opt.get_config()).noise_multiplier
    1.1
    """


@keras.utils.register_keras_serializable(package="tf_tempered")
class DPKerasSGDOptimizer(DPOptimizerMixin, _Refusals, _BASES["SGD"]):
    __doc__ = _doc("SGD")


@keras.utils.register_keras_serializable(package="tf_tempered")
class DPKerasAdamOptimizer(DPOptimizerMixin, _Refusals, _BASES["Adam"]):
    __doc__ = _doc("Adam")


@keras.utils.register_keras_serializable(package="tf_tempered")
class DPKerasAdagradOptimizer(DPOptimizerMixin, _Refusals, _BASES["Adagrad"]):
    __doc__ = _doc("Adagrad")
