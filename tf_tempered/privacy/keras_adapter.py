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
"""What make_private installs on a Keras model: its methods that run the DP engine.

One place replaces the model's methods (on the instance; the class is untouched):

* ``train_step``: the DP step (:mod:`tf_tempered.privacy.step.keras_step`);
* ``fit``: batches whose sampling the ε holds for, ε in the logs (:mod:`.fit`);
* ``compile``: Keras' compile, then the optimizer is marked for saving (:mod:`.saving`);
* ``reset_metrics``: also resets the DP metrics (kept out of ``model.metrics``);
* ``compute_loss``/``compute_metrics``: accept a Poisson batch's sample-weight dict
  (Keras 3 builds the compiled loss and metrics under a strategy by calling them on a
  batch as the dataset gives it).
"""

import types

from tf_tempered._compat import KERAS_MAJOR, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import fit, outside_steps, saving, shared_ledgers
from tf_tempered.privacy.fit_in_progress import refuse_during_own_fit
from tf_tempered.privacy.settings import dp_config, model_dp_config
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step import keras_step
from tf_tempered.privacy.step.batch import unpack_sample_weight

__all__ = ["install"]

_INSTALLED = "_tf_tempered_adapter"


def _train_step(self, data):
    return keras_step.train_step(self, data)


def _fit(self, *args, **kwargs):
    refuse_during_own_fit(self, "fit")
    adopt_a_replaced_optimizer(self)
    return fit.private_fit(self, *args, **kwargs)


def _compile(self, *args, **kwargs):
    state = get_state(self)
    if state is not None and state.has_unrecorded_steps():
        # A custom loop's steps, with the σ of the optimizer this compile replaces.
        outside_steps.record_outside_steps(state, model_dp_config(self))
    result = type(self).compile(self, *args, **kwargs)
    if state is not None:
        bind_the_step_optimizer(self, state)
    return result


# On the model: the optimizer its DP step was last prepared for (by make_private or compile).
_STEP_OPTIMIZER = "_tf_tempered_step_optimizer"


def bind_the_step_optimizer(model, state):
    """Marks the model's optimizer for saving and the update guard, as the one its step
    runs (a step traced before is dropped by the caller: make_private, compile)."""
    saving.bind_optimizer(model, state, saving_description)
    keras_bridge.set_untracked(model, _STEP_OPTIMIZER, getattr(model, "optimizer", None))


def adopt_a_replaced_optimizer(model):
    """``model.optimizer = other`` without a compile (between fits, or by a callback): Keras
    keeps running the step it traced with the old optimizer while fit would account the new
    one's σ. The steps taken so far are recorded with the old one's settings and the step is
    traced again, so that the step and ε both follow the new optimizer (as after a compile)."""
    old = vars(model).get(_STEP_OPTIMIZER)
    state = get_state(model)
    if state is None or old is None or old is getattr(model, "optimizer", None):
        return
    config = state.settings or dp_config(old)
    if config is not None and state.has_unrecorded_steps():  # train_on_batch's, the old σ
        outside_steps.record_outside_steps(state, config)
    bind_the_step_optimizer(model, state)
    model.train_function = None


def _train_on_batch(self, *args, **kwargs):
    refuse_during_own_fit(self, "train_on_batch")
    adopt_a_replaced_optimizer(self)
    fit.refuse_train_step_overrides(self)
    if KERAS_MAJOR == 3 and self.distribute_strategy.num_replicas_in_sync > 1:
        raise NotImplementedError(_TRAIN_ON_BATCH_REPLICAS.format(
            replicas=self.distribute_strategy.num_replicas_in_sync))
    result = type(self).train_on_batch(self, *args, **kwargs)
    # Recorded now, with the settings it ran with (a later compile may change them).
    outside_steps.record_steps_of_ledger(self)
    return result


# Keras 3's train_on_batch hands every replica the whole batch: each example would be
# clipped and summed R times against noise added once (σ/R in effect).
_TRAIN_ON_BATCH_REPLICAS = (
    "train_on_batch of a private model under a tf.distribute strategy of {replicas} "
    "replicas: Keras 3 gives every replica the whole batch, so each example would count "
    "{replicas} times in the clipped sum against noise added once (the guarantee would not "
    "hold). Fix: train with fit (it splits each batch among the replicas), or call "
    "train_on_batch on a model built outside the strategy's scope.")


def _reset_metrics(self):
    type(self).reset_metrics(self)
    state = get_state(self)
    if state is not None:
        for metric in state.metrics.all():
            metric.reset_state()


def _compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
    return type(self).compute_loss(self, x, y, y_pred, unpack_sample_weight(sample_weight)[0],
                                   **kwargs)


def _compute_metrics(self, x, y, y_pred, sample_weight=None, **kwargs):
    return type(self).compute_metrics(self, x, y, y_pred,
                                      unpack_sample_weight(sample_weight)[0], **kwargs)


def _configure_distribution(model):
    """Keras 2 under MultiWorkerMirroredStrategy: report the replicas' logs as they are.

    TF-Keras reduces the per-replica logs of ``fit`` with ``distribute_reduction_method``
    "auto", which is "sum" across workers; its metric results are already global
    (``Metric.result()`` merges the replicas), so the sum would report R times the
    loss and metrics. "first" reports them once (Keras 3 averages: nothing to do).
    """
    strategy = model.distribute_strategy
    if (KERAS_MAJOR == 2 and strategy.num_replicas_in_sync > 1
            and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and keras_bridge.reduction_method_is_default(model)):
        model.distribute_reduction_method = "first"


def _record_steps_of_others_sharing(state):
    """The custom-loop steps of the other models sharing ``state``'s ledger (not in a fit:
    a fit records its own), into the ledger about to be saved."""
    outside_steps.record_steps_of_collected_models()
    for other in shared_ledgers.models_sharing(state.ledger):
        other_state = get_state(other)
        if other_state is state or other_state.run is not None or \
                not other_state.has_unrecorded_steps():
            continue
        config = model_dp_config(other)
        if config is not None:
            outside_steps.record_outside_steps(other_state, config)


def saving_description(state, optimizer=None):
    """The DP dict saved with a private model's optimizer (never the key); the steps of a
    custom loop or train_on_batch not yet in the ledger are recorded first."""
    settings = state.settings
    config = settings or (dp_config(optimizer) if optimizer is not None else None)
    # During a fit, the steps the ledger lacks are the fit's own (its segment below, and
    # the ledger's at its end): recorded here as steps outside fit they counted twice.
    if config is not None and state.run is None and state.has_unrecorded_steps():
        outside_steps.record_outside_steps(state, config)
    _record_steps_of_others_sharing(state)
    ledger = state.ledger.to_config()
    # Saved during a fit (its own, or one of a model sharing its ledger): its steps so far
    # count too.
    model = next((m for m in shared_ledgers.models_sharing(state.ledger)
                  if get_state(m) is state), None)
    running = (outside_steps.running_segments(model) if model is not None
               else [state.run.segment()] if state.run is not None else [])
    ledger["segments"].extend(dict(vars(segment)) for segment in running)
    return {
        "settings": None if settings is None else {
            "l2_norm_clip": settings.l2_norm_clip,
            "noise_multiplier": settings.noise_multiplier,
            "num_microbatches": settings.num_microbatches},
        "sampling": state.sampling,
        "augmentation_multiplicity": state.augmentation_multiplicity,
        "options": {k: v for k, v in vars(state.options).items()},
        "ledger": ledger,
        "public_layers": list(state.public_layers),
    }


def install(model):
    """Installs the DP engine's methods on ``model`` (idempotent)."""
    if vars(model).get(_INSTALLED):
        return
    for name, method in (("train_step", _train_step), ("fit", _fit), ("compile", _compile),
                         ("train_on_batch", _train_on_batch),
                         ("reset_metrics", _reset_metrics), ("compute_loss", _compute_loss),
                         ("compute_metrics", _compute_metrics)):
        keras_bridge.set_untracked(model, name, types.MethodType(method, model))
    _configure_distribution(model)
    keras_bridge.set_untracked(model, _INSTALLED, True)
