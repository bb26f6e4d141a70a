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
"""PrivacyBudget: ε in the logs, a stop before a target ε, and a ledger that survives kills.

On a model prepared by ``make_private`` the ε is the model's own (its privacy ledger
and the batches its ``fit`` actually draws, see :mod:`tf_tempered.privacy.fit`); the
budget adds what only it knows — a target to stop at, δ and the accountant if you
give them, releases made before training (``prior_events``), and a ledger file that
counts DP steps across killed and resumed runs — and refuses settings that contradict
the run (e.g. ``sampling="poisson"`` for shuffled batches). On a model tf_tempered
does not train (TF Privacy's own DP path), it computes ε itself from its arguments,
with ``sampling="shuffle"`` unless told otherwise (Keras' batches are shuffled). What the
budget reads from the model (DP settings, whether ε holds): :mod:`tf_tempered.budget_settings`.
"""

import math
import numbers
import os
import warnings

from tf_tempered._compat import keras, tf
from tf_tempered import budget_settings, keras_bridge
# Re-exported (tf_tempered.callbacks imports it from here): budget_settings.py.
from tf_tempered.budget_settings import dp_optimizer_settings
from tf_tempered.privacy import accounting, shared_ledgers
from tf_tempered.privacy.ledger_file import read_ledger_file, write_ledger_file
from tf_tempered.privacy.state import get_state

__all__ = ["PrivacyBudget", "dp_optimizer_settings"]


class PrivacyBudget(keras.callbacks.Callback):
    """Logs ``epsilon`` after each epoch; stops before an epoch that would exceed the target.

    After each epoch ``logs["epsilon"]`` is the ε spent so far; if one more epoch would
    spend more than ``target_epsilon``, training stops (a warning says so), and if even
    the first epoch would, no step is taken. On a private model (make_private) ε is the
    model's: every DP step it took, with the sampling its batches were drawn with, and
    arguments that contradict the run (``sampling``, ``num_examples``, ``batch_size``,
    ``noise_multiplier``) are refused; ``delta`` and ``accountant``, when given, become the
    model's. Otherwise ε is computed from the arguments (σ and microbatches from the DP
    optimizer where not given; ``sampling="shuffle"`` unless given). ``prior_events``
    (dp_accounting DpEvents of releases on the same data before training) are composed in.

    ``ledger="<backup dir>/privacy_ledger.json"``: for runs killed and resumed
    (``keras.callbacks.BackupAndRestore``, which keeps a ledger of its own when no budget
    does). The file holds every DP step taken, written before each step counting it
    (atomically), and a later fit (a new process too) adds to it, so the
    steps of a killed run that the restore rolled back and training redid are counted,
    never forgotten. ``steps_taken`` and ``logs["dp_steps"]`` give the count. Needs
    ``steps_per_execution=1``.

    ``epsilon_holds``: True for make_private's secret randomness, False (and a warning)
    with ``insecure_dp_seed``, None when tf_tempered does not draw the noise.

    >>> budget = PrivacyBudget(target_epsilon=3.0, delta=1e-5, num_examples=60000,
    ...                        batch_size=256, noise_multiplier=1.1, sampling="poisson")
    >>> round(budget.epsilon_after(60, steps_per_epoch=None), 3)
    2.597
    """

    def __init__(self, *, target_epsilon, delta=None, num_examples=None, batch_size=None,
                 noise_multiplier=None, sampling=None, accountant=None, microbatch_size=None,
                 ledger=None, prior_events=()):
        super().__init__()
        if (isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real)
                or not target_epsilon > 0):
            raise ValueError(f"target_epsilon must be a positive number, got "
                             f"{target_epsilon!r}; pass e.g. target_epsilon=3.0.")
        if sampling is not None and sampling not in accounting.SAMPLINGS:
            raise ValueError(f"sampling must be one of {accounting.SAMPLINGS}, got "
                             f"{sampling!r}.")
        if accountant is not None and accountant not in accounting.ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}, got "
                             f"{accountant!r}.")
        self.target_epsilon = float(target_epsilon)
        self.delta, self.accountant = delta, accountant
        self.num_examples, self.batch_size = num_examples, batch_size
        self.noise_multiplier, self.sampling = noise_multiplier, sampling
        self.microbatch_size = microbatch_size
        self.prior_events = accounting.check_prior_events(prior_events)
        self.epsilons = []  # ε after each completed epoch (all fits that share a ledger)
        self.stopped_epoch = None  # epoch index after which training was stopped
        self.epsilon_holds = None
        # A str: tf.io.gfile paths (gs://...) too, which pathlib would mangle.
        self.ledger = None if ledger is None else os.fspath(ledger)
        self.steps_taken = 0  # DP steps counted in the ledger file (all runs), if any
        self._run = None  # the private model's fit (fit.RunAccount), else None
        self._legacy = None  # (σ, microbatch size) of a model tf_tempered does not train
        self._blocked_train_function = None

    # -- ε of a model tf_tempered does not train (from the arguments) -----------------
    def epsilon_after(self, epochs, *, steps_per_epoch):
        """ε after ``epochs`` epochs of ``steps_per_epoch`` steps (None: TF Privacy's count),
        from the budget's arguments (a model tf_tempered does not train)."""
        sigma, microbatch = self._legacy or (self.noise_multiplier, self.microbatch_size)
        kwargs = dict(num_examples=self.num_examples, batch_size=self.batch_size,
                      noise_multiplier=sigma, delta=self.delta or accounting.DEFAULT_DELTA,
                      sampling=self.sampling or "shuffle",
                      accountant=self.accountant or accounting.DEFAULT_ACCOUNTANT,
                      microbatch_size=microbatch or 1, prior_events=self.prior_events)
        if steps_per_epoch is None or kwargs["sampling"] == "shuffle":
            return accounting.compute_epsilon(epochs=epochs, **kwargs)
        return accounting.compute_epsilon(steps=epochs * steps_per_epoch, **kwargs)

    def _resolve_legacy(self):
        self._legacy = budget_settings.legacy_dp_settings(
            self.model, num_examples=self.num_examples, batch_size=self.batch_size,
            noise_multiplier=self.noise_multiplier, microbatch_size=self.microbatch_size)
        if self.sampling == "poisson" and self.model is not None:
            raise ValueError(
                "PrivacyBudget(sampling=\"poisson\") on a model tf_tempered does not train: "
                "Keras' fit draws shuffled fixed-size batches here, which earn only the bound "
                "without amplification. Fix: drop sampling= (that bound is accounted), or "
                "make_private(model) so that fit draws Poisson batches.")
        self.epsilon_after(1, steps_per_epoch=None)  # raises ValueError on bad settings

    def _legacy_epsilon(self, more_epochs, steps_per_epoch):
        """ε of every step the model's optimizer has taken (earlier fits too), plus
        ``more_epochs`` epochs: on a model tf_tempered does not train."""
        steps = int(self.model.optimizer.iterations.numpy())
        steps += more_epochs * (steps_per_epoch or math.ceil(self.num_examples / self.batch_size))
        if steps == 0:
            return 0.0
        sigma, microbatch = self._legacy
        return accounting.compute_epsilon(
            num_examples=self.num_examples, batch_size=self.batch_size, noise_multiplier=sigma,
            steps=steps, delta=self.delta or accounting.DEFAULT_DELTA,
            sampling=self.sampling or "shuffle",
            accountant=self.accountant or accounting.DEFAULT_ACCOUNTANT,
            microbatch_size=microbatch or 1, prior_events=self.prior_events)

    def _check_legacy_pass(self):
        """Refuses num_examples/batch_size whose pass is longer than the fit's epoch: ε would
        count fewer passes over the data than Keras makes (each epoch reshuffles)."""
        steps, per_pass = self._steps_per_epoch(), math.ceil(self.num_examples / self.batch_size)
        if self.model is not None and steps is not None and per_pass > steps:
            raise ValueError(
                f"PrivacyBudget(num_examples={self.num_examples}, batch_size="
                f"{self.batch_size}) makes a pass {per_pass} steps long, but this fit takes "
                f"{steps} steps an epoch, a pass over its data each: ε would count fewer "
                "passes than the run makes. Fix: give the fit's num_examples and batch_size, "
                "or make_private(model) (its budget reads them from the run).")

    # -- a private model's fit ----------------------------------------------------------
    def _resolve_private(self, state):
        run = state.run
        if run is None:
            raise ValueError(
                "PrivacyBudget on a model prepared by make_private counts the steps of its "
                "fit: use it in model.fit(..., callbacks=[budget]).")
        drawn = run.sampling
        if self.sampling is not None and self.sampling != drawn.kind:
            raise ValueError(
                f"PrivacyBudget(sampling={self.sampling!r}), but this fit's batches are "
                f"{'Poisson-sampled' if drawn.kind == 'poisson' else 'not Poisson-sampled'} "
                f"(accounted as {drawn.kind!r}). Fix: drop sampling= (the budget follows the "
                "batches actually drawn); for Poisson batches fit on arrays (sampling="
                "\"poisson\" in make_private, the default) or on tf_tempered.privacy."
                "poisson_batches(...).")
        for name, given, actual in (("num_examples", self.num_examples, drawn.num_examples),
                                    ("batch_size", self.batch_size, drawn.batch_size),
                                    ("noise_multiplier", self.noise_multiplier,
                                     run.noise_multiplier)):
            if given is not None and actual is not None and not math.isclose(
                    float(given), float(actual), rel_tol=1e-9):
                raise ValueError(
                    f"PrivacyBudget({name}={given!r}), but this fit trains with {name}="
                    f"{actual!r}. Fix: drop {name}= (the budget reads it from the run) or "
                    "give the run's value.")
        if self.delta is not None or self.accountant is not None:
            shared_ledgers.set_accounting(self.model, state.ledger, self.delta,
                                          self.accountant, "PrivacyBudget")
            if self.delta is not None:  # make_private warned of its own δ only
                accounting.warn_if_weak_delta(self.delta, drawn.num_examples)
        state.ledger.add_prior_events(self.prior_events)
        self._run = run

    @property
    def keeps_ledger_file(self):
        """True when the budget keeps the run's ledger in a file (``ledger=``): a
        BackupAndRestore in the same fit then keeps no second one."""
        return self.ledger is not None

    def _load_ledger_file(self, state):
        """Adds the steps a ledger file holds to the model's ledger (once per model)."""
        data = read_ledger_file(self.ledger, state, self._run)
        self.epsilons = list(data.get("epsilons", []))

    def _write_ledger(self, state, ahead=0):
        self.steps_taken = write_ledger_file(self.ledger, state, self._run, ahead=ahead,
                                             epsilons=self.epsilons)

    # -- Keras callback ---------------------------------------------------------------
    def _steps_per_epoch(self):
        return (self.params or {}).get("steps")

    def _epsilon(self, more_epochs, epoch=-1):
        """ε now (more_epochs=0) or after ``more_epochs`` more epochs."""
        steps = self._steps_per_epoch()
        if self._run is not None:
            if more_epochs and steps is None:
                steps = self._epoch_length_so_far()
            return self._run.epsilon(more_steps=more_epochs * (steps or 0), more_passes=(
                more_epochs * self._run.passes_of_epoch(steps or 0)))
        return self._legacy_epsilon(more_epochs, steps)

    def _epoch_length_so_far(self):
        """Steps per epoch of a pipeline of unknown length: the mean of this fit's epochs
        (0 before the first ends: shuffled batches are accounted by passes, one an epoch,
        so the look-ahead holds; Poisson steps are then not looked ahead)."""
        return math.ceil(self._run.steps() / self._run.epochs) if self._run.epochs else 0

    def on_train_begin(self, logs=None):
        state = get_state(self.model) if self.model is not None else None
        self._run = None
        if state is not None:
            self._resolve_private(state)
        else:
            self._resolve_legacy()
            self._check_legacy_pass()
        # From the model's DP randomness; warns (at Keras' call) if ε may not hold.
        self.epsilon_holds = budget_settings.epsilon_holds(self.model)
        self.epsilons, self.stopped_epoch = [], None
        if self.ledger is not None:
            if self._run is None:
                raise ValueError("PrivacyBudget(ledger=...) counts the DP steps of a model "
                                 "prepared by tf_tempered.make_private.")
            if keras_bridge.steps_per_execution(self.model) != 1:
                raise ValueError(
                    "PrivacyBudget(ledger=...) counts one DP step per train batch; compile "
                    "with steps_per_execution=1 (the default).")
            tf.io.gfile.makedirs(os.path.dirname(self.ledger) or ".")
            self._load_ledger_file(state)
            self.steps_taken = state.ledger.steps
        first = self._epsilon(1)
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

    def on_train_batch_begin(self, batch, logs=None):
        # Before the step, counting it: a kill between the step and a write after it
        # would lose it (its update may be in the next backup), one before it over-counts.
        if self.ledger is not None and self._blocked_train_function is None:
            self._write_ledger(get_state(self.model), ahead=1)

    def on_epoch_end(self, epoch, logs=None):
        if self._blocked_train_function is not None:
            return
        epsilon = self._epsilon(0, epoch)
        self.epsilons.append(epsilon)
        if logs is not None:
            logs["epsilon"] = epsilon
            if self.ledger is not None:
                logs["dp_steps"] = self.steps_taken
        if self.ledger is not None:
            self._write_ledger(get_state(self.model))
        following = self._epsilon(1, epoch)
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
