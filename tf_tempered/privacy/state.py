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
"""The one place a private model's state lives: :class:`PrivateState`.

``make_private(model)`` creates it and keeps it on the model as one untracked
attribute (never in the model's weights, checkpoints or saved files: it holds the
secret noise key); every stage of the DP step, the ``fit`` adapter, the callbacks and
saving read it with :func:`get_state`.
"""

import dataclasses
from typing import Any, Optional

from tf_tempered import keras_bridge

__all__ = ["PrivateState", "RetiredKey", "get_state", "attach_state", "SAMPLINGS"]

# How ``fit`` batches in-memory data: Poisson sampling (the amplified ε), or Keras'
# shuffled batches (the bound without amplification).
SAMPLINGS = ("poisson", "shuffle")

_ATTRIBUTE = "_tf_tempered_state"


@dataclasses.dataclass(eq=False)
class RetiredKey:
    """A noise key a later make_private replaced. A step traced before that call (a
    ``tf.function`` of a DPGradients loop) still draws from it, with the settings it was
    traced with: its later steps are counted too (outside_steps.record_outside_steps).

    Attributes:
      noise: the replaced DPRandomness (its counter counts the steps drawn from it).
      config: the DPConfig the model trained with under that key.
      steps_accounted: steps of that key already in the ledger.
    """

    noise: Any
    config: Any
    steps_accounted: int


@dataclasses.dataclass(eq=False)
class PrivateState:
    """Everything the DP engine keeps for one private model.

    Attributes:
      settings: the DP settings given to make_private (a DPConfig), or None: then the
        compiled DP optimizer's are used.
      options: the EngineOptions (how norms and clipped sums are computed).
      noise: the DPRandomness keying the model's Gaussian noise (secret).
      sampling: "poisson" or "shuffle": how ``fit`` batches in-memory data.
      augmentation_multiplicity: augmented copies of each example in a batch.
      ledger: the PrivacyLedger of the DP steps taken so far.
      metrics: the step's DP metrics (dp_clipped_fraction, dp_grad_norm, ...).
      layer_paths: which handler and path each layer took in the last traced step.
      generic_logged: whether the generic-VJP layers were logged (once per model).
      steps_accounted: steps of the current noise key already in the ledger.
      run: the accounting of the ``fit`` in progress (fit.RunAccount), or None.
      warned: the one-time warnings already given for this model.
      loaded_ledgers: the ledger files (PrivacyBudget's, BackupAndRestore's) already read
        into ``ledger``: each is read once per model.
      audit_hook: None, except in a model a privacy audit trains
        (:mod:`tf_tempered.audit`): ``hook(summed, variables, counter)`` returns the
        clipped sum with the audit's gradient canaries added, before the noise.
      public_layers: names of layers whose adapt()-fit state came from public data
        (:mod:`~tf_tempered.privacy.public_layers`).
      retired_keys: the RetiredKey of every noise key make_private replaced.
    """

    settings: Any
    options: Any
    noise: Any
    sampling: str
    augmentation_multiplicity: int
    ledger: Any
    metrics: Any
    layer_paths: Optional[list] = None
    generic_logged: bool = False
    steps_accounted: int = 0
    run: Any = None
    warned: set = dataclasses.field(default_factory=set)
    loaded_ledgers: set = dataclasses.field(default_factory=set)
    audit_hook: Any = None
    public_layers: tuple = ()
    retired_keys: list = dataclasses.field(default_factory=list)

    def steps_taken(self):
        """DP steps the model has taken with its current noise key (the noise counter)."""
        return int(self.noise.draws())

    def has_unrecorded_steps(self):
        """Whether a noise key (the current or a retired one) drew steps no ledger holds."""
        return self.steps_taken() > self.steps_accounted or any(
            int(key.noise.draws()) > key.steps_accounted for key in self.retired_keys)


def get_state(model):
    """The PrivateState of ``model``, or None if make_private has not prepared it."""
    return vars(model).get(_ATTRIBUTE) if hasattr(model, "__dict__") else None


def attach_state(model, state):
    """Keeps ``state`` on ``model`` out of Keras' tracking (no weight, no checkpoint)."""
    keras_bridge.set_untracked(model, _ATTRIBUTE, state)
