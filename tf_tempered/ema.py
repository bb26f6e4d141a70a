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
"""Exponential moving average (EMA) of a model's weights, as a Keras callback.

After every training batch ``t > start_step``, for every trainable variable ``w``:

    shadow ← decay · shadow + (1 − decay) · w

(before and at ``start_step`` the shadow just tracks ``w``), so after ``T`` averaged
steps from ``w_0``, ``shadow_T = decay^T w_0 + (1 − decay) Σ_{t=1..T} decay^(T−t) w_t``.
The averaged weights are swapped in for the validation pass of ``fit`` (then swapped
back, so training continues from the raw weights) and, at the end of training, for
good: the model then holds the EMA weights, as De et al. (2022, "Unlocking
high-accuracy differentially private image classification through scale") evaluate.

Privacy: the shadow is a function of the weights DP-SGD released after each step
only, never of the data directly, so it is post-processing of the DP mechanism's
outputs and costs no privacy: the run's (ε, δ) covers the averaged model unchanged.

Only trainable variables are averaged. Non-trainable ones keep their current value:
they hold counters and RNG state (the DP noise counter, seed generators), where an
average is meaningless, and statistics such as BatchNormalization's moving moments,
which are themselves averages already (the paper's models have none).

The shadow lives in the callback, not in the model: a run resumed by
``keras.callbacks.BackupAndRestore`` restarts the average from the restored weights.
Tested on one device (both Kerases); not tested under a tf.distribute strategy.
"""

import numbers

import numpy as np

from tf_tempered._compat import keras, tf

__all__ = ["ExponentialMovingAverage"]


class ExponentialMovingAverage(keras.callbacks.Callback):
    """Keeps ``shadow ← decay·shadow + (1−decay)·w`` after each batch (module docstring).

    Args:
        decay: in (0, 1); the average spans about ``1 / (1 − decay)`` steps.
        start_step: batches (counted from the start of ``fit``) during which the shadow
            just copies the weights; averaging starts after it.
        swap_for_validation: evaluate ``fit``'s validation data with the EMA weights.

    ``shadow_weights()`` returns the averages (NumPy); ``swap_in()`` puts them in the
    model and saves the raw weights, ``swap_out()`` restores those exactly.
    """

    def __init__(self, decay=0.999, start_step=0, swap_for_validation=True):
        super().__init__()
        if isinstance(decay, bool) or not isinstance(decay, numbers.Real) \
                or not 0 < decay < 1:
            raise ValueError(f"decay={decay!r} is invalid: it must be in (0, 1), e.g. 0.999.")
        if isinstance(start_step, bool) or not isinstance(start_step, numbers.Integral) \
                or start_step < 0:
            raise ValueError(f"start_step={start_step!r} is invalid: it must be a "
                             "non-negative integer, e.g. 0.")
        if not isinstance(swap_for_validation, (bool, np.bool_)):
            raise ValueError(f"swap_for_validation={swap_for_validation!r} is invalid: it must "
                             "be True or False.")
        self.decay, self.start_step = float(decay), int(start_step)
        self.swap_for_validation = bool(swap_for_validation)
        self.step = 0
        self._vars = self._shadows = self._saved = self._update = None
        self._in_fit = False

    def on_train_begin(self, logs=None):
        self._vars = list(self.model.trainable_variables)
        if not self._vars:
            raise ValueError("ExponentialMovingAverage: the model has no trainable variables "
                             "to average; build it before fit().")
        self._shadows = [tf.Variable(tf.convert_to_tensor(v), trainable=False)
                         for v in self._vars]
        self.step, self._in_fit = 0, True

        @tf.function
        def update(decay):  # decay 0 copies the weights (up to start_step)
            for shadow, var in zip(self._shadows, self._vars):
                w = tf.convert_to_tensor(var)
                d = tf.cast(decay, w.dtype)
                shadow.assign(d * shadow + (1 - d) * w)

        self._update = update

    def on_train_batch_end(self, batch, logs=None):
        self.step += 1
        self._update(tf.constant(self.decay if self.step > self.start_step else 0.0,
                                 tf.float64))

    def on_test_begin(self, logs=None):
        if self._in_fit and self.swap_for_validation:
            self.swap_in()

    def on_test_end(self, logs=None):
        if self._in_fit and self.swap_for_validation:
            self.swap_out()

    def on_train_end(self, logs=None):
        self._in_fit = False
        self.swap_in()
        self._saved = None  # the EMA weights stay: the trained model is the average

    def shadow_weights(self):
        """The averaged trainable weights, as NumPy arrays in trainable_variables order."""
        if self._shadows is None:
            raise ValueError("ExponentialMovingAverage: no average yet; call fit() first.")
        return [s.numpy() for s in self._shadows]

    def swap_in(self):
        """Puts the averages into the model, keeping the raw weights for :meth:`swap_out`."""
        if self._saved is not None:
            raise ValueError("ExponentialMovingAverage: the averages are already swapped in.")
        self._saved = [tf.identity(tf.convert_to_tensor(v)) for v in self._vars]
        for var, shadow in zip(self._vars, self.shadow_weights()):
            var.assign(shadow)

    def swap_out(self):
        """Restores exactly the raw weights :meth:`swap_in` saved."""
        if self._saved is None:
            raise ValueError("ExponentialMovingAverage: swap_out() without swap_in().")
        for var, raw in zip(self._vars, self._saved):
            var.assign(raw)
        self._saved = None
