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
must report ε for all of them. Every private weight carries its ledger (a tag on the
variable, so it outlives its model: a layer kept after its model was collected still
brings its ledger), and ``make_private`` gives a model the ledger its weights carry, or
a live private model sharing one of them has (trainable or not: a frozen shared part
was trained by the other, and may be unfrozen later). Weights from several ledgers (a
model on the encoders of two private models) merge them into one, which every model
and weight of theirs then uses: steps any of them took are composed in. The union may
over-count when the models train on different data (a bound that holds), never
under-count.
"""

import weakref

from tf_tempered import keras_bridge
from tf_tempered.privacy import ledger_lineage
from tf_tempered.privacy.ledger import PrivacyLedger
from tf_tempered.privacy.state import get_state

__all__ = ["register", "shared_ledger", "models_sharing", "tag_weights", "set_accounting",
           "merge_new_weights", "current", "private_models", "weights_ledgers"]

_PRIVATE_MODELS = weakref.WeakValueDictionary()  # id(model) -> model, while it lives
_LEDGER = "_tf_tempered_ledger"  # on a private model's weights: the ledger of their steps
_MERGED_INTO = "_tf_tempered_merged_into"  # on a ledger merged into another


def register(model):
    """Records ``model`` as private (make_private calls it once it holds its state)."""
    _PRIVATE_MODELS[id(model)] = model


def private_models():
    """The private models alive now."""
    return list(_PRIVATE_MODELS.values())


def tag_weights(model, ledger):
    """Marks ``model``'s weights as trained under ``ledger``."""
    for variable in keras_bridge.existing_weights(model):
        if hasattr(variable, "__dict__"):
            keras_bridge.set_untracked(variable, _LEDGER, ledger)


def merge_new_weights(model):
    """Weights built after ``make_private`` (a Sequential without an Input is built by its
    first fit; two such models may share a layer): the ledgers merge as make_private merges
    them, and the new weights carry the result. Called before ε is read or a fit begins,
    and after a fit."""
    state = get_state(model)
    if state is None:
        return
    state.ledger = shared_ledger(model, state.ledger)
    tag_weights(model, state.ledger)


def current(ledger):
    """The ledger ``ledger`` was merged into (through every merge since), or itself."""
    while ledger is not None and vars(ledger).get(_MERGED_INTO) is not None:
        ledger = vars(ledger)[_MERGED_INTO]
    return ledger


def shared_ledger(model, ledger):
    """The ledger ``model`` should use: ``ledger``, or the one its weights (or a live
    private model sharing a weight with it) carry, into which ``ledger`` and any other
    such ledger are merged."""
    weights = keras_bridge.existing_weights(model)
    found = [current(vars(v).get(_LEDGER)) for v in weights if hasattr(v, "__dict__")]
    mine = {keras_bridge.variable_key(v) for v in weights}
    for other in list(_PRIVATE_MODELS.values()):
        state = get_state(other) if other is not model else None
        if state is not None and mine & {keras_bridge.variable_key(v)
                                         for v in keras_bridge.existing_weights(other)}:
            found.append(current(state.ledger))
    others = []
    for candidate in found:
        if candidate is not None and candidate is not ledger and not any(
                candidate is seen for seen in others):
            others.append(candidate)
    if not others:
        return ledger
    target = others[0]  # its δ and accountant (make_private's delta= may change them)
    for merged in [ledger, *others[1:]]:
        _merge(merged, target)
    return target


def _merge(ledger, target):
    # Its steps that target lacks (both may hold a save's: a model loaded from it, and
    # a private model whose part loaded its weights), then its lineage.
    ledger_lineage.absorb(target, ledger.to_config())
    ledger_lineage.merge_lineage(ledger, target)
    target.delta = min(target.delta, ledger.delta)  # the guarantee each was given, or stronger
    keras_bridge.set_untracked(ledger, _MERGED_INTO, target)
    for model in models_sharing(ledger):
        get_state(model).ledger = target


def set_accounting(model, ledger, delta, accountant, where):
    """Sets the δ and accountant ``ledger`` counts ε with (None: kept); ``where`` names the
    caller in the error. A larger δ is refused where another live private model shares
    ``ledger`` (a private model nested in ``model``): its ε would be reported at a weaker
    guarantee than it was given, silently (probe T F6: its logged ε fell while it trained).
    A smaller δ holds for both (ε at 1e-6 bounds ε at 1e-5), and either accountant is a valid
    bound."""
    checked = PrivacyLedger(delta=ledger.delta if delta is None else delta,
                            accountant=ledger.accountant if accountant is None else accountant)
    others = [m for m in models_sharing(ledger) if m is not model]
    if checked.delta > ledger.delta and others:
        raise ValueError(
            f"{where}(delta={checked.delta!r}): this model shares its privacy ledger with the "
            f"private model {others[0].name!r} (they share weights), whose ε is counted at "
            f"delta={ledger.delta!r}; a larger delta would weaken the guarantee reported for "
            f"it. Fix: leave delta unset, or give at most {ledger.delta!r} (a smaller delta "
            "holds for both).")
    ledger.delta, ledger.accountant = checked.delta, checked.accountant


def models_sharing(ledger):
    """The live private models whose state holds ``ledger``."""
    return [model for model in list(_PRIVATE_MODELS.values())
            if get_state(model) is not None and get_state(model).ledger is ledger]


def weights_ledgers(model):
    """The distinct ledgers of ``model``'s weights: its own first if private, then those its
    weights carry (parts of private models)."""
    state = get_state(model)
    found = [state.ledger] if state is not None else []
    found += [vars(v).get(_LEDGER) for v in keras_bridge.existing_weights(model)
              if hasattr(v, "__dict__")]
    ledgers = []
    for ledger in (current(f) for f in found if f is not None):
        if not any(ledger is seen for seen in ledgers):
            ledgers.append(ledger)
    return ledgers
