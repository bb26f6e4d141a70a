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
"""The mark on weights loaded from a private model's file, not yet made private again.

A loaded model's weights (``load_model``: its marked optimizer's build, :mod:`.saving`;
``load_weights`` of a private model's weights file, :mod:`.weight_files`) carry the DP dict
saved with them: a plain optimizer's update of them is refused
(:func:`.saving.refuse_loaded_updates`) and make_private finds the settings and ledger
(:func:`.saving.saved_dps`), until make_private releases them.
"""

import weakref

from tf_tempered import keras_bridge
from tf_tempered.privacy import ledger_lineage

__all__ = ["LOADED", "HOW", "is_loaded_weight", "loaded_dp", "loaded_how",
           "mark_loaded_weights", "unmark", "mark_loaded_when_built",
           "mark_weights_built_since_load", "pending_dps", "forget_pending", "weights_by_layer",
           "private_part", "mark_loaded_iterations", "loaded_iterations"]

LOADED = "_tf_tempered_loaded_dp"  # on a loaded model's variables: the DP dict saved with it
HOW = "_tf_tempered_loaded_how"  # and how they came (the refusal of a plain update says it)


def is_loaded_weight(variable):
    """Whether ``variable`` holds weights loaded from a private model's file, not yet made
    private again."""
    return loaded_dp(variable) is not None


def loaded_dp(variable):
    """The DP dict ``variable`` was loaded with, or None."""
    return vars(variable).get(LOADED) if hasattr(variable, "__dict__") else None


def loaded_how(variable):
    """How ``variable``'s marked weights came, e.g. "loaded by load_weights", or None."""
    return vars(variable).get(HOW) if hasattr(variable, "__dict__") else None


def mark_loaded_weights(variables, saved, how=None):
    """``variables`` came from a private model's file (``load_weights``): marked with the DP
    dict ``saved`` as a loaded model's are, so a plain update of them is refused and
    make_private finds the settings and ledger. One marked already (by another file: a
    partial load may have kept it) keeps both ledgers (:func:`.ledger_lineage.combined_dp`).
    ``how``: how they came, for the refusal's text (e.g. "loaded by load_model")."""
    combined = {}
    for variable in variables:
        held = loaded_dp(variable)
        mark = saved
        if held is not None and held is not saved:
            if id(held) not in combined:
                combined[id(held)] = ledger_lineage.combined_dp([held, saved])
            mark = combined[id(held)]
        for alias in keras_bridge.variable_aliases(variable):
            keras_bridge.set_untracked(alias, LOADED, mark)
            if how is not None:
                keras_bridge.set_untracked(alias, HOW, how)


def unmark(variable):
    """make_private took the DP dict ``variable`` was marked with: it trains as its model's."""
    for alias in keras_bridge.variable_aliases(variable):
        for mark in (LOADED, HOW):
            if hasattr(alias, "__dict__") and mark in vars(alias):
                delattr(alias, mark)


def weights_by_layer(model):
    """The weights of ``model``'s layers, depth first, and for each the classes of the layers
    holding it, its index in its layer and its shape: what a load by structure (Keras 3's
    paths of layer classes, tf-keras' topological order) matches a file's weights by."""
    weights, structure = [], []

    def visit(layer, outer):
        chain = [*outer, type(layer).__name__]
        inner = keras_bridge.sublayers(layer)
        own = [w for w in keras_bridge.existing_weights(layer)
               if not any(w is v for sub in inner for v in keras_bridge.existing_weights(sub))]
        for index, weight in enumerate(own):
            weights.append(weight)
            shape = getattr(weight, "shape", None)  # (tf-keras' lookup tables have none)
            structure.append(["/".join(chain), index,
                              None if shape is None else [int(d) for d in shape]])
        for sub in inner:
            visit(sub, chain)

    visit(model, [])
    return weights, structure


def private_part(model, saved, *, in_order=True):
    """The weights of ``model`` a file's DP dict ``saved`` covers: those it lists as private
    (a plain head on a private encoder saved which they are) when loaded in order into the
    same layers (classes, nesting, shapes), else all."""
    weights, structure = weights_by_layer(model)
    if in_order and "private_weights" in saved and saved.get("weight_structure") == structure:
        return [weights[i] for i in saved["private_weights"]]
    return weights


_PENDING = weakref.WeakValueDictionary()  # id -> a model loaded before it was built
_PENDING_DP = "_tf_tempered_pending_loaded_dp"
_PENDING_HOW = "_tf_tempered_pending_loaded_how"


def mark_loaded_when_built(model, saved, how=None):
    """tf-keras restores a TF checkpoint into a model not built yet when it is built: its
    weights are marked (:func:`mark_loaded_weights`) before any update, as make_private's
    tags are (update_guard)."""
    keras_bridge.set_untracked(model, _PENDING_DP, ledger_lineage.combined_dp(
        [vars(model).get(_PENDING_DP), saved]))
    keras_bridge.set_untracked(model, _PENDING_HOW, how)
    _PENDING[id(model)] = model


def mark_weights_built_since_load():
    """Marks the weights of the models loaded before they were built, once they are."""
    for model in list(_PENDING.values()):
        if keras_bridge.existing_weights(model):  # (a TF checkpoint: restored in order)
            saved = vars(model).pop(_PENDING_DP)
            mark_loaded_weights(private_part(model, saved), saved,
                                vars(model).pop(_PENDING_HOW, None))
            _PENDING.pop(id(model), None)


def pending_dps(model):
    """The DP dict of a load into ``model`` before it was built, in a list (empty if none)."""
    return [vars(model)[_PENDING_DP]] if _PENDING_DP in vars(model) else []


def forget_pending(model):
    """make_private took it (:func:`.saving.release_loaded_variables`)."""
    vars(model).pop(_PENDING_DP, None)
    vars(model).pop(_PENDING_HOW, None)
    _PENDING.pop(id(model), None)


# On an optimizer: its update count right after a private model's weights file was loaded
# into its model (Keras 3 restores ``iterations`` from the file: the file's DP steps).
_ITERATIONS_LOADED = "_tf_tempered_iterations_loaded"


def mark_loaded_iterations(optimizer):
    """Remembers ``optimizer``'s update count as the loaded file's (DP) steps."""
    inner = keras_bridge.inner_optimizer(optimizer) if optimizer is not None else None
    iterations = getattr(inner, "iterations", None)
    if iterations is not None:
        keras_bridge.set_untracked(inner, _ITERATIONS_LOADED, int(iterations.numpy()))


def loaded_iterations(optimizer):
    """The update count ``optimizer`` had when a private model's weights were loaded into
    its model (0 if none were)."""
    inner = keras_bridge.inner_optimizer(optimizer) if optimizer is not None else None
    return vars(inner).get(_ITERATIONS_LOADED, 0) if inner is not None else 0
