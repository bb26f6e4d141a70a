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

A file written by a plain model carries nothing, and deletes an old private save's
``<path>.tf_tempered_dp.json``. ``tf.train.Checkpoint`` files written directly carry no
ledger (see docs/keras_features.md).
"""

import json
import os
import warnings
import zipfile

import h5py
import numpy as np

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy import (keras_adapter, ledger_lineage, saving, shared_ledgers,
                                 update_guard)
from tf_tempered.privacy.state import get_state

__all__ = ["DATASET", "SIDECAR_SUFFIX", "dp_to_save", "read_dp", "write_dp"]

DATASET = "tf_tempered_dp"
SIDECAR_SUFFIX = ".tf_tempered_dp.json"


def dp_to_save(model):
    """The DP dict ``model``'s weights carry: its own if private, its private owner's
    (a part of a private model), the one it was loaded with, or None."""
    state = get_state(model)
    if state is not None:
        return keras_adapter.saving_description(
            state, keras_bridge.inner_optimizer(getattr(model, "optimizer", None)))
    ledger = shared_ledgers.weights_ledger(model)
    if ledger is not None:
        owners = shared_ledgers.models_sharing(ledger)
        if owners:
            return dp_to_save(owners[0])
        return {"ledger": ledger.to_config()}  # its models are gone: the ledger alone
    return saving.saved_dp(model)


def write_dp(filepath, dp):
    """Writes ``dp`` into the weights file at ``filepath`` (HDF5) or beside it."""
    path, sidecar = _paths(filepath)
    if _local_hdf5(path):
        with h5py.File(path, "a") as f:
            if DATASET in f:
                del f[DATASET]
            if dp is not None:
                f.create_dataset(DATASET, data=np.frombuffer(json.dumps(dp).encode(), np.uint8))
        return
    if dp is None:
        if tf.io.gfile.exists(sidecar):  # an earlier private save's, now stale
            tf.io.gfile.remove(sidecar)
        return
    with tf.io.gfile.GFile(sidecar, "w") as f:
        f.write(json.dumps(dp))


def read_dp(filepath):
    """The DP dict the weights file at ``filepath`` carries, or None."""
    path, sidecar = _paths(filepath)
    if _local_hdf5(path):
        with h5py.File(path, "r") as f:
            return json.loads(bytes(f[DATASET][()]).decode()) if DATASET in f else None
    if path.endswith(".keras") and tf.io.gfile.exists(path):
        return _dp_in_keras_file(path)
    if tf.io.gfile.exists(sidecar):
        with tf.io.gfile.GFile(sidecar) as f:
            return json.loads(f.read())
    return None


def _paths(filepath):
    path = os.fspath(filepath) if isinstance(filepath, os.PathLike) else str(filepath)
    return path, path + SIDECAR_SUFFIX


def _local_hdf5(path):
    return "://" not in path and os.path.isfile(path) and h5py.is_hdf5(path)


def _dp_in_keras_file(path):
    """The DP dict in a ``.keras`` file's compiled optimizer (``load_weights`` of one)."""
    with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f) as archive:
        config = json.loads(archive.read("config.json"))
    found = []

    def visit(node):
        if isinstance(node, dict):
            if node.get("registered_name") == saving.REGISTERED_NAME and "dp" in node.get(
                    "config", {}):
                found.append(node["config"]["dp"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(config)
    return found[0] if found else None


def _saved(model, filepath):
    write_dp(filepath, dp_to_save(model))


def _loaded(model, filepath):
    dp = read_dp(filepath)
    if dp is None or not dp.get("ledger"):
        return
    ledger = shared_ledgers.weights_ledger(model)
    if ledger is not None:
        ledger_lineage.absorb(ledger, dp["ledger"])
        return
    saving.mark_loaded_weights(model, dp)
    # Steps traced before the load would keep updating them without the check: they fail
    # now (a loop's), or are traced anew (fit's own, then refused by the check).
    loops = update_guard.fail_traced_plain_updates(model, keras_bridge.existing_weights(model))
    model.train_function = None  # fit traces its step anew: the check refuses it
    if loops:
        warnings.warn(_TRACED_BEFORE_LOAD.format(names=", ".join(loops)), stacklevel=4)


_TRACED_BEFORE_LOAD = (
    "load_weights: these weights come from a private model (its DP settings and privacy ledger "
    "are in the file), and a tf.function traced before updates them with {names}. Called "
    "again it raises InvalidArgumentError (under jit_compile=True it writes NaN into them) "
    "instead of training them without differential privacy. Fix: make_private(model) (no "
    "arguments: the saved settings; ε goes on from the saved ledger), then define the "
    "training step again with tf_tempered.privacy.DPGradients (docs/custom_loops.md), or "
    "train with the model's own fit.")


keras_bridge.after_weight_files(_saved, _loaded)
