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
"""``fit`` of a private model: batches whose sampling the ε holds for, and ε in the logs.

``model.fit(...)`` of a model make_private prepared:

1. refuses to start without DP settings (it would train without privacy);
2. draws the batches as :mod:`tf_tempered.privacy.fit_data` says (Poisson batches
   from arrays by default) and knows their sampling;
3. puts ``epsilon`` and ``delta`` into every epoch's logs, from the model's privacy
   ledger and the steps this fit has taken: its first callback does, so History,
   TensorBoard, CSVLogger and the progress bar see them, whatever the callback order;
4. records the fit's steps in the ledger when it ends (or fails): later fits, saving,
   PrivacyBudget and :func:`epsilon_spent` count them.

DP steps taken outside ``fit`` are recorded by :mod:`~tf_tempered.privacy.outside_steps`.
"""

import math
import warnings

from tf_tempered._compat import keras
from tf_tempered import keras_bridge
from tf_tempered.privacy import accounting
from tf_tempered.privacy.fit_data import batch_spec, plan_fit_data, rows_batched
from tf_tempered.privacy.ledger import Segment
from tf_tempered.privacy.ledger_file import backup_ledgers
from tf_tempered.privacy.outside_steps import (follow_weights_built_since,
                                               record_steps_of_ledger, running_segments)
from tf_tempered.privacy.public_layers import refuse_data_fitted_layers
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step.plan import require_dp_settings

__all__ = ["RunAccount", "EpsilonLog", "private_fit", "refuse_train_step_overrides",
           "epsilon_spent", "NO_NOISE_WARNING", "warn_training_metric_monitors"]

NO_NOISE_WARNING = (
    "noise_multiplier=0: no noise is added, so this training is NOT differentially private "
    "(ε is infinite; the logs say epsilon=inf). Fix: a noise_multiplier > 0, e.g. from "
    "tf_tempered.privacy.noise_multiplier_for_epsilon(target_epsilon=..., ...).")


def warn_training_metric_monitors(callbacks):
    """Warns for each callback that acts on a training metric (``monitor="loss"``,
    ``"accuracy"``...): those are statistics of the private batches computed without DP
    noise, so its decisions (when to stop, the learning rate, which checkpoint to keep)
    depend on the training data outside ε. ``val_*``, ``epsilon`` and ``delta`` are fine."""
    for callback in callbacks:
        monitor = getattr(callback, "monitor", None)
        if (not isinstance(monitor, str) or monitor.startswith("val_")
                or monitor in ("epsilon", "delta")):
            continue
        if (isinstance(callback, keras.callbacks.ModelCheckpoint)
                and not getattr(callback, "save_best_only", False)):
            continue  # saves every time: decides nothing from the metric
        warnings.warn(
            f"{type(callback).__name__}(monitor={monitor!r}) acts on a metric of the private "
            "training batches, computed without DP noise: its decisions (when to stop, the "
            "learning rate, which checkpoint to keep) depend on the training data outside "
            "the ε this fit reports. Fix: monitor a validation metric (e.g. monitor=\"val_loss\" "
            "with validation_data= from data outside the training set), or drop the callback.",
            UserWarning, stacklevel=4)


def refuse_train_step_overrides(model):
    """fit and train_on_batch of a private model run the DP step, not a train_step of the
    model's class (make_private refuses such a class, but for a DPGradients' model, whose
    loop of its own calls that DP step): refused instead of skipping it silently."""
    owner = keras_bridge.overriding_class(model, "train_step")
    if owner is not None:
        raise TypeError(
            f"{owner}.train_step would not run: fit (and train_on_batch) of a private model "
            "run the DP step on the loss given to compile, so the override's own loss, "
            "updates and logs would be skipped silently. Fix: drop the train_step override, "
            "or run your step in a loop of your own: gradients from "
            "tf_tempered.privacy.DPGradients, applied with an optimizer of your own, not "
            "model.optimizer (docs/custom_loops.md).")


class RunAccount:
    """The DP steps of one fit: its sampling, σ, and the steps and passes taken so far."""

    def __init__(self, state, run_sampling, config):
        self.state = state
        self.sampling = run_sampling
        self.config = config
        self.noise_multiplier = config.noise_multiplier
        self.start = None
        self.epochs = 0  # epochs that took a step
        self.passes = 0  # their passes over the data (passes_of_epoch)
        self._epoch_start = None
        self.finished = False

    def begin(self, model):
        record_steps_of_ledger(model)  # steps outside fit before it, of every sharing model
        self.start = self.state.steps_taken()
        self._epoch_start = self.start
        self.state.run = self

    def steps(self):
        return 0 if self.start is None else self.state.steps_taken() - self.start

    def end_epoch(self):
        """Counts the passes over the data of the epoch, if it took a step."""
        now = self.state.steps_taken()
        if now > self._epoch_start:
            self.epochs += 1
            self.passes += self.passes_of_epoch(now - self._epoch_start)
        self._epoch_start = now

    def passes_of_epoch(self, steps):
        """Passes over the data an epoch of ``steps`` steps begins (1 for steps ≤ a pass).

        Keras starts a finite pipeline again each epoch: an epoch of 5 batches of a
        4-batch pass (``ds.batch(16).repeat().take(5)``) holds one pass and the start of
        another, 2 passes, every epoch (probe T, F1: counted as 5/4 an epoch, ε 8.94 for
        11.89 after 4 epochs). With one iterator for every epoch, the fit's steps count
        (_segment)."""
        run = self.sampling
        if run.kind != "shuffle" or not run.steps_per_pass or run.persistent_iterator:
            return 1
        return max(1, math.ceil(steps / run.steps_per_pass))

    def segment(self, more_steps=0, more_passes=0):
        """The fit's Segment so far (plus ``more_steps`` steps and ``more_passes`` passes)."""
        return self._segment(self.state.steps_taken(), more_steps, more_passes)

    def segment_ahead(self, steps):
        """The fit's Segment after ``steps`` more steps in the epoch under way."""
        taken = self.state.steps_taken()  # read once: each read is a TF op
        return self._segment(taken, 0, 0, ahead_in_epoch=steps)

    def _segment(self, taken, more_steps, more_passes, ahead_in_epoch=0):
        run = self.sampling
        steps = (0 if self.start is None else taken - self.start) + more_steps + ahead_in_epoch
        passes = self.passes + more_passes
        in_epoch = ahead_in_epoch + (0 if self._epoch_start is None else taken - self._epoch_start)
        if in_epoch > 0:
            passes += self.passes_of_epoch(in_epoch)  # an epoch in progress is a pass begun
        if run.kind == "shuffle" and run.steps_per_pass and run.persistent_iterator:
            # One iterator for every epoch (an endless pipeline fit by steps_per_epoch): the
            # fit's steps run on through the passes, one epoch or several a pass. (Restarted
            # each epoch, the epochs' own counts are never fewer.)
            passes = max(passes, math.ceil(steps / run.steps_per_pass))
        passes *= run.pass_weight  # batches that may hold an example several times
        return Segment(run.kind, self.noise_multiplier, steps=steps, passes=passes,
                       sampling_probability=run.sampling_probability,
                       multi_example_microbatches=run.multi_example_microbatches)

    def epsilon(self, more_steps=0, more_passes=0):
        """ε of the model's ledger and this fit (plus ``more_steps``/``more_passes``)."""
        return self.state.ledger.epsilon(extra=[self.segment(more_steps, more_passes)])

    def finish(self):
        """Records the fit's steps in the model's ledger (once)."""
        if self.finished or self.start is None:
            return
        self.finished = True
        self.state.ledger.add(self.segment())
        self.state.steps_accounted = self.state.steps_taken()
        if self.state.run is self:
            self.state.run = None


class EpsilonLog(keras.callbacks.Callback):
    """Writes ``epsilon`` and ``delta`` into each epoch's logs (the first callback of a
    private model's fit)."""

    def __init__(self, account):
        super().__init__()
        self.account = account

    def on_train_begin(self, logs=None):
        self.account.begin(self.model)

    def on_epoch_end(self, epoch, logs=None):
        self.account.end_epoch()
        if logs is not None:
            logs["epsilon"] = self.account.epsilon()
            logs["delta"] = self.account.state.ledger.delta

    def on_train_end(self, logs=None):
        self.account.finish()


def private_fit(model, *args, **kwargs):
    """``Model.fit`` of a private model (installed by make_private; see the module docstring)."""
    state = get_state(model)
    config = require_dp_settings(model)
    refuse_train_step_overrides(model)  # (a DPGradients lets make_private take such a class)
    refuse_data_fitted_layers(model, state.public_layers)  # before tracing: a plain error
    if config.noise_multiplier == 0:
        warnings.warn(NO_NOISE_WARNING, UserWarning, stacklevel=3)
    arguments = keras_bridge.fit_arguments(model, args, kwargs)
    arguments, run_sampling = plan_fit_data(model, state, config, arguments)
    accounting.warn_if_weak_delta(state.ledger.delta,
                                  run_sampling.num_examples or rows_batched(arguments), stacklevel=3)
    account = RunAccount(state, run_sampling, config)
    callbacks = arguments.get("callbacks")
    callbacks = keras_bridge.callbacks_as_list(callbacks)
    warn_training_metric_monitors(callbacks)
    # EpsilonLog first (every other callback sees ε), then the ledger files of
    # BackupAndRestore (read before the run's ε is first logged).
    arguments["callbacks"] = [EpsilonLog(account), *backup_ledgers(account, callbacks),
                              *callbacks]
    # Keras 3 would build the compiled metrics inside the step's first trace, and trace
    # the (costly) DP step twice for their variables.
    keras_bridge.build_compiled_state(model, batch_spec(arguments))
    try:
        return type(model).fit(model, **arguments)
    finally:
        account.finish()  # also when fit fails or is interrupted: those steps were taken
        follow_weights_built_since(model)  # built by this fit


def epsilon_spent(model):
    """``(ε, δ)`` spent so far by a private model's training: every fit (the one in
    progress included) and the DP steps outside fit, at the model's δ.

    >>> from tf_tempered._compat import keras
    >>> from tf_tempered.privacy import make_private
    >>> model = make_private(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]),
    ...                      l2_norm_clip=1.0, noise_multiplier=1.1)
    >>> epsilon_spent(model)
    (0.0, 1e-05)
    """
    state = get_state(model)
    if state is None:
        raise ValueError(f"model {getattr(model, 'name', model)!r} was not prepared by "
                         "make_private; tf_tempered does not account its training.")
    record_steps_of_ledger(model)
    return state.ledger.epsilon(extra=running_segments(model)), state.ledger.delta
