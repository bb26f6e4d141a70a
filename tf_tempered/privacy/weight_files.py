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
"""A private model's DP settings and privacy ledger travel with its weights files.

``model.save_weights(path)`` (and ``ModelCheckpoint(save_weights_only=True)``, Keras 3's
``BackupAndRestore``) writes weights only: a run resumed from them in a new model counted ε
from 0, although the weights took every earlier step. So when the weights are a private
model's (or a part of one, or loaded from one), the file keeps the DP dict its ``.keras``
save keeps (:mod:`.saving`: settings, sampling, ledger with the steps of a fit in
progress; never the key): in an HDF5 file as the dataset ``tf_tempered_dp`` (JSON bytes),
beside any other format (tf-keras' TF checkpoints, sharded or remote files) in
``<path>.tf_tempered_dp.json``. ``load_weights`` then

* into a private model (or a part of one): adds the saved steps its ledger lacks
  (:mod:`.ledger_lineage`: its own checkpoint adds nothing, a later checkpoint of the same
  run only the steps since the earlier);
* into any other model: marks the weights as a loaded private model's (a plain optimizer's
  update of them is refused, :func:`.saving.refuse_loaded_updates`), and ``make_private``
  takes the settings and ledger saved (no arguments needed), as after ``load_model``.

A plain model holding some private weights (a head on a private encoder) also saves which
of its weights they are; a load in order (not ``by_name``, not ``skip_mismatch``) into a model
of the same layers and shapes marks only those.
A file written by a plain model carries nothing, and deletes an old private save's
``<path>.tf_tempered_dp.json``. ``tf.train.Checkpoint`` files written directly carry no
ledger (see docs/keras_features.md).
"""

import warnings

from tf_tempered import keras_bridge
from tf_tempered.privacy import (keras_adapter, ledger_lineage, loaded_marks, shared_ledgers,
                                 update_guard)
from tf_tempered.privacy import saving
from tf_tempered.privacy.dp_in_files import read_dp, write_dp
from tf_tempered.privacy.state import get_state

__all__ = ["dp_to_save", "apply_loaded_dp", "carry_dp"]


def dp_to_save(model):
    """The DP dict ``model``'s weights carry: its own if private, its private owner's
    (a part of a private model), the one it was loaded with, or None."""
    state = get_state(model)
    if state is not None:
        return keras_adapter.saving_description(
            state, keras_bridge.inner_optimizer(getattr(model, "optimizer", None)))
    dp = ledger_lineage.combined_dp([*(_owners_dp(ledger) for ledger in
                                       shared_ledgers.weights_ledgers(model)),
                                     *saving.saved_dps(model)])
    if dp is None:
        return None
    weights, structure = loaded_marks.weights_by_layer(model)
    private = [i for i, w in enumerate(weights) if _is_private(w)]
    if len(private) == len(weights):
        return dp
    # Some are not (a plain head on a private encoder): a load marks only those that are.
    return {**dp, "private_weights": private, "weight_structure": structure}


def carry_dp(source, copy, copied):
    """``copy`` holds ``source``'s weights in variables of its own (``copied``: the pairs
    (source variable, copy variable); tf_tempered.swap_activations). The copies of weights
    trained under DP (a private model's, or loaded from one and not made private since) are
    marked as loaded ones are, with a snapshot of the DP dict: a plain update is refused, and
    make_private(copy) takes the settings and goes on counting from the steps they took, as
    after ``save_weights`` and ``load_weights`` (sharing the source's live ledger, a copy's
    ε also counted the steps the source and other copies took after it)."""
    dp = dp_to_save(source)
    if dp is None:
        return
    private = [new for old, new in copied if _is_private(old)]
    # None of them marked one by one (a loaded model marked at its optimizer): all.
    loaded_marks.mark_loaded_weights(private or keras_bridge.existing_weights(copy), dp,
                                     "copied by tf_tempered.swap_activations")


def _is_private(variable):
    return update_guard.is_private_weight(variable) or loaded_marks.is_loaded_weight(variable)


def _owners_dp(ledger):
    owners = shared_ledgers.models_sharing(ledger)
    if owners:
        return dp_to_save(owners[0])
    return {"ledger": ledger.to_config()}  # its models are gone: the ledger alone


def _saved(model, filepath):
    write_dp(filepath, dp_to_save(model))


def _loaded(model, filepath, by_name=False, skip_mismatch=False, updates_before=None):
    apply_loaded_dp(model, read_dp(filepath), by_name=by_name, skip_mismatch=skip_mismatch,
                    updates_before=updates_before)


def apply_loaded_dp(model, dp, *, how="loaded by load_weights", by_name=False,
                    skip_mismatch=False, updates_before=None):
    """``model`` now holds the weights of a private model whose DP dict is ``dp`` (read from
    a weights file, or a plain fit's backup: :mod:`.plain_backups`): a private model's ledger
    adds the steps it lacks, a plain model's weights are marked (``how``: how they came, for
    the refusal of a plain update). ``updates_before``: the model's optimizer's update count
    before the load (0: the count after it, Keras 3's restored one, is the file's DP steps)."""
    if dp is None or not dp.get("ledger"):
        return
    if get_state(model) is not None:
        ledger_lineage.absorb(get_state(model).ledger, dp["ledger"])
        return
    for ledger in shared_ledgers.weights_ledgers(model):  # parts of live private models:
        ledger_lineage.absorb(ledger, dp["ledger"])        # those weights are the file's now
    if not keras_bridge.existing_weights(model):  # tf-keras restores into a model not
        loaded_marks.mark_loaded_when_built(model, dp, how)  # built yet once it is built
        return
    weights = loaded_marks.private_part(model, dp, in_order=not (by_name or skip_mismatch))
    marked = [w for w in weights if not update_guard.is_private_weight(w)]
    loaded_marks.mark_loaded_weights(marked, dp, how)
    if updates_before == 0:  # else plain updates before the load stay warned of (probe A2, F3)
        loaded_marks.mark_loaded_iterations(getattr(model, "optimizer", None))
    # A step traced before the load (the model's fit, a loop's tf.function) would keep
    # updating them without the check, which runs while tracing: it fails from now on. (Its
    # train_function is kept: Keras 3's BackupAndRestore loads inside fit, which calls it.)
    traced = update_guard.fail_traced_plain_updates(marked)
    if traced:
        warnings.warn(_TRACED_BEFORE_LOAD.format(
            names=", ".join(sorted({type(o).__name__ for o, _ in traced}))), stacklevel=5)


_TRACED_BEFORE_LOAD = (
    "load_weights: these weights come from a private model (its DP settings and privacy ledger "
    "are in the file), and a training step traced before (this model's fit, or a loop's "
    "tf.function) updates them with {names}. Called again it raises InvalidArgumentError "
    "(compiled with XLA, it writes NaN into them) instead of training them without "
    "differential privacy. Fix: make_private(model) (no arguments: the saved settings; ε goes "
    "on from the saved ledger), then fit, or define a loop's step again with "
    "tf_tempered.privacy.DPGradients (docs/custom_loops.md).")


keras_bridge.after_weight_files(_saved, _loaded)
