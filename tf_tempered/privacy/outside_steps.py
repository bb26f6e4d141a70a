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
"""DP steps taken outside ``fit`` (``train_on_batch``, a custom loop, DPGradients) in
the model's ledger: steps on batches the engine did not draw (no amplification). The
noise key counts every DP step; what a fit did not account is recorded here, for the
model and every private model sharing its ledger (shared weights), also once a model
with unrecorded steps is collected.
"""

import weakref

from tf_tempered import keras_bridge
from tf_tempered.privacy import shared_ledgers, update_guard
from tf_tempered.privacy.ledger import Segment
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step.plan import require_dp_settings

__all__ = ["follow_weights_built_since", "record_outside_steps",
           "record_steps_of_collected_models", "record_steps_of_ledger",
           "record_steps_when_collected", "running_segments"]


def record_outside_steps(state, config):
    """Records the DP steps taken since the ledger last counted (train_on_batch, custom
    loops) as steps on batches the engine did not draw. ``config``: the DPConfig they
    ran with (with num_microbatches, a microbatch may hold several examples). Steps of a
    retired noise key (a loop traced before make_private was called again) count with
    the settings of their key."""
    for key in state.retired_keys:
        drawn = int(key.noise.draws())
        _record_unsampled(state.ledger, drawn - key.steps_accounted, key.config)
        key.steps_accounted = drawn
    drawn = state.steps_taken()
    _record_unsampled(state.ledger, drawn - state.steps_accounted, config)
    state.steps_accounted = drawn


def record_steps_of_ledger(model):
    """Records the steps outside fit of ``model`` and of every private model sharing its
    ledger (shared weights: each must report ε for the steps of all; weights built since
    make_private are followed first)."""
    record_steps_of_collected_models()
    follow_weights_built_since(model)
    for sharing in _sharing(model):
        state = get_state(sharing)
        # A model in its fit: its steps so far are that fit's, recorded when it ends.
        if state is not None and state.run is None and state.has_unrecorded_steps():
            record_outside_steps(state, require_dp_settings(sharing))


def follow_weights_built_since(model):
    """Weights built after make_private (a Sequential without an Input is built by its
    first fit) are a private model's as make_private's: updated only with DP
    (update_guard), and under the ledger of every private model sharing them."""
    update_guard.tag_private_weights(model)
    shared_ledgers.merge_new_weights(model)


# On a model: [its state], for recording its steps left out of the ledger once it is collected.
_LEFT_STEPS = "_tf_tempered_left_steps"
# The states of collected models, recorded at the next read of any ledger (not while the
# garbage collector runs: it may run inside a graph, where no counter can be read).
_COLLECTED = []


def record_steps_when_collected(model, state):
    """Records the custom loop steps (DPGradients') not yet in ``model``'s ledger once the
    model is collected: a model sharing the ledger may read ε after it is gone."""
    holder = vars(model).get(_LEFT_STEPS)
    if holder is None:
        holder = [state]
        keras_bridge.set_untracked(model, _LEFT_STEPS, holder)
        weakref.finalize(model, _COLLECTED.append, holder).atexit = False
    holder[0] = state


def record_steps_of_collected_models():
    """Records the steps of the collected models' custom loops (record_steps_when_collected)."""
    while _COLLECTED:
        state = _COLLECTED.pop()[0]
        # With no settings of its own, its σ was its DP optimizer's, gone with it.
        if state.settings is not None and state.run is None and state.has_unrecorded_steps():
            state.ledger = shared_ledgers.current(state.ledger)
            record_outside_steps(state, state.settings)


def _sharing(model):
    """``model`` and the live private models sharing its ledger."""
    ledger = get_state(model).ledger
    return {id(m): m for m in [model, *shared_ledgers.models_sharing(ledger)]}.values()


def running_segments(model):
    """The segments so far of the fits in progress of ``model`` and of the models sharing
    its ledger (a model saved, or its ε read, by a callback of another's fit)."""
    return [get_state(m).run.segment() for m in _sharing(model)
            if get_state(m) is not None and get_state(m).run is not None]


def _record_unsampled(ledger, steps, config):
    if steps > 0:
        ledger.add(Segment("unsampled", config.noise_multiplier, steps=steps,
                           multi_example_microbatches=config.num_microbatches is not None))
