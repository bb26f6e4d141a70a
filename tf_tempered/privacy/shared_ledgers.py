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
"""One privacy ledger for private models that share weights.

Two private models built on one encoder (multi-task heads, a sub-model of another) each
train the shared weights: what either releases has seen the DP steps of both, so each
must report ε for all of them. ``make_private`` gives a model the ledger of any live
private model that holds one of its weights (trainable or not: a frozen shared part was
trained by the other, and may be unfrozen later); steps either model took before are
composed in. The union may over-count when the models train on different data (a
bound that holds), never under-count.
"""

import weakref

from tf_tempered import keras_bridge
from tf_tempered.privacy.state import get_state

__all__ = ["register", "shared_ledger", "models_sharing"]

_PRIVATE_MODELS = weakref.WeakValueDictionary()  # id(model) -> model, while it lives


def register(model):
    """Records ``model`` as private (make_private calls it once it holds its state)."""
    _PRIVATE_MODELS[id(model)] = model


def shared_ledger(model, ledger):
    """The ledger ``model`` should use: ``ledger``, or the one of a live private model
    sharing a weight with it, into which ``ledger``'s segments and prior releases go."""
    mine = {keras_bridge.variable_key(v) for v in keras_bridge.existing_weights(model)}
    for other in list(_PRIVATE_MODELS.values()):
        state = get_state(other) if other is not model else None
        if state is None or state.ledger is ledger or not mine & {
                keras_bridge.variable_key(v) for v in keras_bridge.existing_weights(other)}:
            continue
        state.ledger.segments.extend(ledger.segments)
        state.ledger.add_prior_events(ledger.prior_events)
        return state.ledger  # its δ and accountant (make_private's delta= may change them)
    return ledger


def models_sharing(ledger):
    """The live private models whose state holds ``ledger``."""
    return [model for model in list(_PRIVATE_MODELS.values())
            if get_state(model) is not None and get_state(model).ledger is ledger]
