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
"""Keras callbacks: a privacy budget that stops training, and an activation-norm monitor.

Both are callbacks of the active Keras (Keras 3 by default, Keras 2 with
``TF_USE_LEGACY_KERAS=1``).

* :class:`PrivacyBudget` writes ``epsilon`` (ε spent so far, from
  :func:`tf_tempered.privacy.accounting.compute_epsilon`) into the epoch logs, hence
  into ``History``, and stops training before an epoch that would exceed
  ``target_epsilon``. It warns, and sets ``epsilon_holds = False``, when the model's
  DP randomness is not secret (``make_private(..., insecure_dp_seed=K)``).
* :class:`ActivationNormMonitor` records the mean per-example L2 norm of a layer's
  outputs on held-out data after each epoch (Papernot et al. 2021, Figure 4: tempered
  sigmoids keep activations bounded while ReLU activations grow) and plots it.
"""

import json
import math
import numbers
import os
import pathlib
import warnings

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import accounting, engine, randomness, settings

__all__ = ["PrivacyBudget", "ActivationNormMonitor", "plot_activation_norms",
           "dp_optimizer_settings"]


def dp_optimizer_settings(optimizer):
    """(noise_multiplier, num_microbatches) of a DP optimizer (ours or TF Privacy's), or None.

    tf_tempered.privacy.DPKeras* optimizers keep σ as ``noise_multiplier``; TF Privacy's
    GenericDP*/DPKeras* optimizers keep σ as ``_dp_sum_query._stddev /
    _dp_sum_query._l2_norm_clip``; VectorizedDPKeras* ones as ``_noise_multiplier``.
    ``num_microbatches`` is None when each example is its own microbatch.

    >>> from tf_tempered.privacy import DPKerasSGDOptimizer
    >>> dp_optimizer_settings(DPKerasSGDOptimizer(l2_norm_clip=2.0, noise_multiplier=1.1,
    ...                                           num_microbatches=4))
    (1.1, 4)
    >>> dp_optimizer_settings(keras.optimizers.SGD()) is None
    True
    """
    if optimizer is None:
        return None
    _check_no_gradient_accumulation(optimizer)
    config = engine.dp_config(optimizer)  # the one reader of TF Privacy's optimizer settings
    return None if config is None else (config.noise_multiplier, config.num_microbatches)


def _check_no_gradient_accumulation(optimizer):
    steps = getattr(optimizer, "gradient_accumulation_steps", None) or 1
    if steps > 1:
        raise ValueError(
            f"gradient_accumulation_steps={steps} > 1 is not "
            f"accounted for (the batch and the noise per update change); account for it "
            f"yourself with tf_tempered.privacy.accounting.compute_epsilon.")


def _model_dp_settings(model):
    """(σ, num_microbatches) the model trains with, or None.

    make_private's settings if it was given some, else the DP optimizer's
    (:func:`tf_tempered.privacy.settings.model_dp_config`), else TF Privacy's
    DPModel/DPSequential (σ on the model).
    """
    _check_no_gradient_accumulation(getattr(model, "optimizer", None))
    config = settings.model_dp_config(model)
    if config is not None:
        return config.noise_multiplier, config.num_microbatches
    if getattr(model, "_noise_multiplier", None) is not None:
        sigma = model._noise_multiplier  # pylint: disable=protected-access
        return float(sigma), getattr(model, "_num_microbatches", None)
    return None


def _global_seed_is_set():
    """Whether tf.random.set_seed (or keras.utils.set_random_seed) has fixed a global seed."""
    # An explicit op seed (0) leaves TF's op-seed counter alone; without a global seed,
    # TF pairs it with DEFAULT_GRAPH_SEED = 87654321.
    return tf.compat.v1.get_seed(0)[0] != 87654321


class PrivacyBudget(keras.callbacks.Callback):
    """Logs ``epsilon`` after each epoch; stops before an epoch that would exceed the target.

    After epoch k, ``logs["epsilon"] = compute_epsilon(steps=k · steps_per_epoch, ...)``
    (``steps_per_epoch = params["steps"]``; with ``sampling="shuffle"``, or when Keras
    does not know the steps, ``epochs=k``). If ε after epoch k + 1 would exceed
    ``target_epsilon``, training stops after epoch k. If even one epoch exceeds it,
    no step is trained at all (a warning says so). σ and the microbatch size
    (``batch_size / num_microbatches``) default to the settings given to
    ``make_private(model, l2_norm_clip=..., noise_multiplier=...)``, else to the
    model's DP optimizer's. ``prior_events`` (dp_accounting DpEvents of releases on
    the same data before training, e.g. DP feature statistics) are composed into every
    ε, the stopping rule's included.

    Runs that are killed and resumed (``keras.callbacks.BackupAndRestore``): pass
    ``ledger="<backup dir>/privacy_ledger.json"``. The callback then counts every DP
    step it sees end (``on_train_batch_end``), writes the count to that file after
    each step (atomically), and at the start of a later ``fit`` with the same ledger
    adds to it. ε is then computed from the steps actually taken, INCLUDING the steps
    of a killed run that the restore rolled back and training redid: those steps
    ran, and their noisy updates may have been seen (logs, intermediate backups), so
    they are counted again, never forgotten. ``steps_taken`` and ``logs["dp_steps"]``
    give that count. Needs ``steps_per_execution=1`` (the default). The ledger also
    keeps ``epsilons`` across resumes. Without a ledger, ε after epoch k counts k
    whole epochs (``initial_epoch`` of a resumed fit included).

    ε holds only if the DP noise and batches are secret. ``epsilon_holds`` is False
    (and a warning says the ε does not hold) for a model made private with
    ``insecure_dp_seed``; None when tf_tempered does not draw the model's noise (TF
    Privacy's own DP path, which follows TensorFlow's global seed: a warning says so
    when one is set); True for ``make_private``'s secret default.

    >>> budget = PrivacyBudget(target_epsilon=3.0, delta=1e-5, num_examples=60000,
    ...                        batch_size=256, noise_multiplier=1.1)
    >>> round(budget.epsilon_after(60, steps_per_epoch=None), 3)
    2.597
    """

    def __init__(self, *, target_epsilon, delta, num_examples, batch_size=None,
                 noise_multiplier=None, sampling=accounting.DEFAULT_SAMPLING,
                 accountant=accounting.DEFAULT_ACCOUNTANT, microbatch_size=None,
                 ledger=None, prior_events=()):
        super().__init__()
        if (isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real)
                or not target_epsilon > 0):
            raise ValueError(f"target_epsilon must be a positive number, got "
                             f"{target_epsilon!r}; pass e.g. target_epsilon=3.0.")
        if sampling not in accounting.SAMPLINGS:
            raise ValueError(f"sampling must be one of {accounting.SAMPLINGS}, got "
                             f"{sampling!r}.")
        if accountant not in accounting.ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}, got "
                             f"{accountant!r}.")
        self.target_epsilon = float(target_epsilon)
        self.delta = delta
        self.num_examples = num_examples
        self.batch_size = batch_size
        self.noise_multiplier = noise_multiplier
        self.sampling = sampling
        self.accountant = accountant
        self.microbatch_size = microbatch_size
        # Releases on the same data before training (e.g. DP feature statistics): every ε
        # reported here composes them in.
        self.prior_events = accounting.check_prior_events(prior_events)
        # Resolved at on_train_begin (from the optimizer where not given).
        self._noise_multiplier, self._microbatch_size = noise_multiplier, microbatch_size
        self.epsilons = []  # ε after each completed epoch of the last fit()
        self.stopped_epoch = None  # epoch index after which training was stopped
        self.epsilon_holds = None  # see the class docstring; set at on_train_begin
        self._blocked_train_function = None
        self.ledger = None if ledger is None else pathlib.Path(ledger)
        self.steps_taken = 0  # DP steps counted in the ledger (all runs), if any

    def _load_ledger(self):
        if self.ledger is None or not self.ledger.exists():
            return {"steps": 0, "epsilons": []}
        state = json.loads(self.ledger.read_text())
        if not isinstance(state.get("steps"), int) or state["steps"] < 0:
            raise ValueError(f"PrivacyBudget: ledger {self.ledger} is corrupt ({state!r}); "
                             f"restore it or start a new run with a new backup directory.")
        return state

    def _write_ledger(self):
        state = {"steps": self.steps_taken, "epsilons": self.epsilons,
                 "noise_multiplier": self._noise_multiplier, "batch_size": self.batch_size,
                 "num_examples": self.num_examples}
        tmp = self.ledger.with_name(self.ledger.name + ".tmp")
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.ledger)  # atomic: a kill leaves the old or the new count

    def _resolve(self):
        """Fills in batch size, σ and microbatch size; validates them with compute_epsilon."""
        if self.batch_size is None:
            raise ValueError(
                "PrivacyBudget needs batch_size= (Keras does not tell callbacks the batch "
                "size): pass the batch size, or the expected batch size under Poisson "
                "sampling, e.g. PrivacyBudget(..., batch_size=256).")
        settings = _model_dp_settings(self.model) if self.model is not None else None
        self._noise_multiplier = self.noise_multiplier
        if self._noise_multiplier is None:
            if settings is None:
                raise ValueError(
                    "PrivacyBudget found no noise_multiplier: the model was not given DP "
                    "settings by tf_tempered.make_private(model, l2_norm_clip=..., "
                    "noise_multiplier=...) and is not compiled with a DP optimizer "
                    "(tf_tempered.privacy.DPKeras*Optimizer, or TF Privacy's "
                    "DPKeras*/GenericDP*/VectorizedDPKeras*). "
                    "Pass noise_multiplier= explicitly.")
            self._noise_multiplier = settings[0]
        self._microbatch_size = self.microbatch_size
        if self._microbatch_size is None:
            num_microbatches = settings[1] if settings is not None else None
            self._microbatch_size = (
                1 if num_microbatches is None
                else max(1, math.ceil(self.batch_size / int(num_microbatches))))
        self.epsilon_after(1, steps_per_epoch=None)  # raises ValueError on bad settings

    def epsilon_after(self, epochs, *, steps_per_epoch):
        """ε after ``epochs`` epochs of ``steps_per_epoch`` steps (None: TF Privacy's count)."""
        kwargs = dict(num_examples=self.num_examples, batch_size=self.batch_size,
                      noise_multiplier=self._noise_multiplier, delta=self.delta,
                      sampling=self.sampling, accountant=self.accountant,
                      microbatch_size=self._microbatch_size or 1,
                      prior_events=self.prior_events)
        if steps_per_epoch is None or self.sampling == "shuffle":
            return accounting.compute_epsilon(epochs=epochs, **kwargs)
        return accounting.compute_epsilon(steps=epochs * steps_per_epoch, **kwargs)

    def _steps_per_epoch(self):
        return (self.params or {}).get("steps")

    def _check_randomness(self):
        """Sets epsilon_holds from the model's DP randomness; warns if ε may not hold."""
        self.epsilon_holds = None
        if self.model is None:
            return
        if engine.is_private(self.model):
            self.epsilon_holds = engine.has_secret_dp_randomness(self.model)
            if not self.epsilon_holds:
                warnings.warn(
                    f"PrivacyBudget: model {self.model.name!r} was made private with "
                    f"insecure_dp_seed, so {randomness.INSECURE_NOTE}; the epsilon logged "
                    f"is what a private run with these settings would spend.",
                    randomness.InsecureDPRandomnessWarning, stacklevel=3)
        elif _global_seed_is_set():
            warnings.warn(
                f"PrivacyBudget: model {self.model.name!r} trains on TF Privacy's own DP path, "
                f"whose noise follows TensorFlow's global seed, and a global seed is set "
                f"(keras.utils.set_random_seed / tf.random.set_seed): anyone who knows it can "
                f"regenerate the noise, and the epsilon does not hold. Use "
                f"tf_tempered.make_private(model) for secret noise.", UserWarning, stacklevel=3)

    def _steps_per_execution(self):
        value = getattr(self.model, "steps_per_execution", None)
        if value is None:
            value = getattr(self.model, "_steps_per_execution", None)
        return 1 if value is None else int(value.numpy() if hasattr(value, "numpy") else value)

    def on_train_begin(self, logs=None):
        self._resolve()
        self._check_randomness()
        self.epsilons = []
        self.stopped_epoch = None
        if self.ledger is not None:
            if self._steps_per_execution() != 1:
                raise ValueError(
                    "PrivacyBudget(ledger=...) counts one DP step per train batch; compile "
                    "with steps_per_execution=1 (the default).")
            state = self._load_ledger()
            self.steps_taken, self.epsilons = state["steps"], list(state["epsilons"])
            self.ledger.parent.mkdir(parents=True, exist_ok=True)
        first = self._epsilon_now(1)
        if first > self.target_epsilon:
            warnings.warn(
                f"PrivacyBudget: one epoch already spends epsilon={first:.4g} > "
                f"target_epsilon={self.target_epsilon:g}; not training. Raise "
                f"noise_multiplier (see noise_multiplier_for_epsilon) or lower the sampling "
                f"rate.", UserWarning, stacklevel=2)
            self.model.stop_training = True
            self.stopped_epoch = -1
            # Keras runs one step before it looks at stop_training: make that a no-op.
            self._blocked_train_function = self.model.train_function
            self.model.train_function = lambda iterator: {}

    def _epsilon_now(self, more_epochs, epoch=-1):
        """ε after ``more_epochs`` more epochs (from the ledger's steps, or epoch + 1 + more)."""
        steps_per_epoch = self._steps_per_epoch()
        if self.ledger is None:
            return self.epsilon_after(epoch + 1 + more_epochs, steps_per_epoch=steps_per_epoch)
        if steps_per_epoch is None:
            raise ValueError("PrivacyBudget(ledger=...) needs the steps per epoch: pass "
                             "steps_per_epoch= to fit, or a dataset of known length.")
        steps = self.steps_taken + more_epochs * steps_per_epoch
        if steps == 0:
            return accounting.prior_epsilon(self.prior_events, delta=self.delta,
                                            accountant=self.accountant)
        if self.sampling == "shuffle":  # counted in (partial epochs rounded up) epochs
            return self.epsilon_after(steps / steps_per_epoch, steps_per_epoch=None)
        return self.epsilon_after(1, steps_per_epoch=steps)  # `steps` steps

    def on_train_batch_end(self, batch, logs=None):
        if self.ledger is not None and self._blocked_train_function is None:
            self.steps_taken += 1
            self._write_ledger()

    def on_epoch_end(self, epoch, logs=None):
        if self._blocked_train_function is not None:
            return
        epsilon = self._epsilon_now(0, epoch)
        self.epsilons.append(epsilon)
        if logs is not None:
            logs["epsilon"] = epsilon
            if self.ledger is not None:
                logs["dp_steps"] = self.steps_taken
        if self.ledger is not None:
            self._write_ledger()
        following = self._epsilon_now(1, epoch)
        if following > self.target_epsilon:
            self.model.stop_training = True
            self.stopped_epoch = epoch
            if epoch + 1 < (self.params or {}).get("epochs", math.inf):
                warnings.warn(
                    f"PrivacyBudget: stopping after epoch {epoch + 1} at epsilon="
                    f"{epsilon:.4g}; one more epoch would spend {following:.4g} > "
                    f"target_epsilon={self.target_epsilon:g}.", UserWarning, stacklevel=2)

    def on_train_end(self, logs=None):
        if self._blocked_train_function is not None:
            self.model.train_function = self._blocked_train_function
            self._blocked_train_function = None


class ActivationNormMonitor(keras.callbacks.Callback):
    """Mean per-example L2 norm of a layer's outputs on held-out data, every few epochs.

    ``norm = mean_i ||flatten(layer(x_i))||_2`` over ``data`` (a NumPy array of inputs,
    or a batched tf.data.Dataset of inputs or of (inputs, labels, ...) tuples, whose
    first item is used). Logged as ``activation_norm/<layer name>`` after each
    ``every``-th epoch and kept in ``.epochs`` / ``.history``.

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
    ...     2, use_bias=False, kernel_initializer="identity", name="hidden")])
    >>> monitor = ActivationNormMonitor("hidden", np.array([[3.0, 4.0], [0.0, 1.0]]))
    >>> monitor.set_model(model)
    >>> monitor.compute()
    3.0
    """

    def __init__(self, layer, data, *, every=1, plot_path=None):
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}; e.g. every=1.")
        if not isinstance(layer, (str, keras.layers.Layer)):
            raise ValueError(f"layer must be a Keras layer or a layer name, got {layer!r}.")
        self.layer = layer
        self.every = int(every)
        self.plot_path = plot_path
        if isinstance(data, tf.data.Dataset):
            spec = data.element_spec
            if isinstance(spec, (tuple, list)):
                data = data.map(lambda *items: items[0])
            self._dataset = data
        else:
            self._dataset = tf.data.Dataset.from_tensor_slices(np.asarray(data)).batch(256)
        self.epochs = []
        self.history = []
        self._probe = None
        self._probe_model = None

    @property
    def layer_name(self):
        return self.layer if isinstance(self.layer, str) else self.layer.name

    @property
    def key(self):
        """The log key, ``activation_norm/<layer name>``."""
        return f"activation_norm/{self.layer_name}"

    def _build_probe(self):
        layer = self.model.get_layer(self.layer) if isinstance(self.layer, str) else self.layer
        try:
            sub_model = keras.Model(self.model.inputs, layer.output)
        except (AttributeError, ValueError, TypeError) as e:
            raise ValueError(
                f"ActivationNormMonitor cannot read the outputs of layer {layer.name!r}: the "
                f"model must be a built Sequential or functional model containing it "
                f"({e}).") from e

        @tf.function(reduce_retracing=True)
        def norms(inputs):
            outputs = tf.cast(sub_model(inputs, training=False), tf.float64)
            return tf.norm(tf.reshape(outputs, [tf.shape(outputs)[0], -1]), axis=1)

        self._probe, self._probe_model = norms, self.model

    def compute(self):
        """The mean per-example L2 norm of the layer's outputs on the data, now."""
        if self._probe is None or self._probe_model is not self.model:
            self._build_probe()
        total, count = 0.0, 0
        for inputs in self._dataset:
            norms = self._probe(inputs).numpy()
            total += float(norms.sum())
            count += norms.shape[0]
        if count == 0:
            raise ValueError("ActivationNormMonitor: data is empty; pass held-out inputs.")
        return total / count

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        value = self.compute()
        self.epochs.append(epoch + 1)
        self.history.append(value)
        if logs is not None:
            logs[self.key] = value

    def on_train_end(self, logs=None):
        if self.plot_path is not None and self.history:
            self.plot(self.plot_path)

    def plot(self, path=None, *, label=None):
        """Saves the norm per epoch as a PNG (matplotlib, Agg); returns the path."""
        path = path if path is not None else self.plot_path
        if path is None:
            raise ValueError("plot needs a path: plot('norms.png') or plot_path= at init.")
        return plot_activation_norms({label or self.layer_name: self}, path)


def plot_activation_norms(monitors, path, *, title="Mean L2 norm of activations"):
    """Saves one PNG comparing several monitors, e.g. {"ReLU": m1, "tempered sigmoid": m2}.

    Uses matplotlib's Agg canvas directly, so the global backend is left alone.
    """
    from tf_tempered._plotting import agg_figure  # pylint: disable=g-import-not-at-top

    figure, (axes,) = agg_figure(figsize=(5, 3.5))
    for label, monitor in monitors.items():
        axes.plot(monitor.epochs, monitor.history, marker="o", label=label)
    axes.set_xlabel("epoch")
    axes.set_ylabel("mean per-example L2 norm")
    axes.set_title(title)
    axes.legend()
    figure.savefig(path, format="png")
    return path
