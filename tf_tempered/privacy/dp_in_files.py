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
"""Where a file keeps the DP dict of the private weights it holds (:mod:`.saving`'s dict:
settings, sampling, ledger; never the key), by format.

* An HDF5 file (a weights file, or a whole model's ``.h5``): the dataset ``tf_tempered_dp``
  (JSON bytes), which Keras' loaders skip.
* Keras 3's ``.keras`` archive: the entry ``tf_tempered_dp.json``; saved unzipped, a
  tf-keras SavedModel directory or an export (``Model.export``): the file
  ``tf_tempered_dp.json`` in it.
* Any other weights file (tf-keras' TF checkpoints, sharded or remote files):
  ``<path>.tf_tempered_dp.json`` beside it.

A private model's whole-model save keeps it in its optimizer's config instead
(:mod:`.saving`); :func:`read_dp` reads both.
"""

import json
import os
import zipfile

import h5py
import numpy as np

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy import ledger_lineage, saving

__all__ = ["DATASET", "ENTRY", "SIDECAR_SUFFIX", "write_dp", "read_dp", "write_model_dp",
           "writable", "read_model_dp"]

DATASET = "tf_tempered_dp"
ENTRY = "tf_tempered_dp.json"
SIDECAR_SUFFIX = ".tf_tempered_dp.json"


def write_dp(filepath, dp):
    """Writes ``dp`` into the weights file at ``filepath`` (HDF5) or beside it; None removes
    an earlier one."""
    path, sidecar = _paths(filepath)
    if _local_hdf5(path):
        _write_dataset(path, dp)
        return
    if dp is None:
        if tf.io.gfile.exists(sidecar):  # an earlier private save's, now stale
            tf.io.gfile.remove(sidecar)
        return
    with tf.io.gfile.GFile(sidecar, "w") as f:
        f.write(json.dumps(dp))


def read_dp(filepath):
    """The DP dict the weights file at ``filepath`` carries (a whole model's file, given to
    ``load_weights`` or loaded with ``compile=False``: the one it keeps for its weights, else
    its private optimizers'), or None."""
    path, sidecar = _paths(filepath)
    kept = read_model_dp(filepath)
    if kept is not None:
        return kept  # (it holds the nested private models' ledgers too: weight_files)
    if _local_hdf5(path):
        with h5py.File(path, "r") as f:
            config = f.attrs.get("training_config")  # a whole model's save (model.save)
        return None if config is None else _dp_in_config(json.loads(
            config.decode() if isinstance(config, bytes) else config))
    if path.endswith(".keras") and tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
        with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f) as archive:
            return _dp_in_config(json.loads(archive.read("config.json")))
    directory = _model_directory(path)
    if directory is not None:
        metadata = keras_bridge.saved_model_metadata(directory)  # tf-keras' SavedModel
        if metadata:
            return _dp_in_config(metadata)
        if tf.io.gfile.exists(f"{directory}/config.json"):  # an unzipped .keras
            with tf.io.gfile.GFile(f"{directory}/config.json") as f:
                return _dp_in_config(json.loads(f.read()))
        return None  # an export (Model.export): its own file only
    if tf.io.gfile.exists(sidecar):
        with tf.io.gfile.GFile(sidecar) as f:
            return json.loads(f.read())
    return None


def write_model_dp(filepath, dp):
    """Writes ``dp`` into the whole model's file ``model.save`` wrote at ``filepath`` (a
    local ``.keras`` file or unzipped directory, HDF5, tf-keras SavedModel directory); None
    removes an earlier one from a directory. Returns whether it could."""
    if not writable(filepath):
        return False
    path, _ = _paths(filepath)
    directory = _model_directory(path)
    if _local_hdf5(path) or (path.endswith(".keras") and zipfile.is_zipfile(path)):
        if dp is None:
            return True  # Keras wrote the file anew: no earlier one there
        if _local_hdf5(path):
            _write_dataset(path, dp)
        else:
            with zipfile.ZipFile(path, "a") as archive:
                archive.writestr(ENTRY, json.dumps(dp))
    elif directory is not None:
        entry = os.path.join(directory, ENTRY)
        if dp is not None:
            with open(entry, "w", encoding="utf-8") as f:
                f.write(json.dumps(dp))
        elif os.path.exists(entry):  # a private model's earlier save there: stale now
            os.remove(entry)
    else:
        return False
    return True


def writable(filepath):
    """Whether :func:`write_model_dp` may add to a save at ``filepath``: a local path (not a
    file object, not a remote ``scheme://`` path)."""
    return isinstance(filepath, (str, os.PathLike)) and "://" not in os.fspath(filepath)


def read_model_dp(filepath):
    """The DP dict :func:`write_model_dp` wrote into the whole model's file at
    ``filepath`` (or the SavedModel ``filepath`` is the checkpoint of), or None."""
    if not isinstance(filepath, (str, os.PathLike)):
        return None
    path, _ = _paths(filepath)
    if _local_hdf5(path):
        with h5py.File(path, "r") as f:
            return json.loads(bytes(f[DATASET][()]).decode()) if DATASET in f else None
    if path.endswith(".keras") and tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
        with tf.io.gfile.GFile(path, "rb") as f, zipfile.ZipFile(f) as archive:
            return _entry(archive)
    directory = _model_directory(path)
    if directory is not None and tf.io.gfile.exists(f"{directory}/{ENTRY}"):
        with tf.io.gfile.GFile(f"{directory}/{ENTRY}") as f:
            return json.loads(f.read())
    return None


_VARIABLES = f"/{tf.saved_model.VARIABLES_DIRECTORY}/{tf.saved_model.VARIABLES_FILENAME}"


def _model_directory(path):
    """The directory of a whole model's save at ``path``: a SavedModel (tf-keras' save, an
    export: ``path``, or its checkpoint ``<dir>/variables/variables``, which tf-keras'
    ``load_weights`` reads) or a Keras 3 ``.keras`` saved unzipped (``zipped=False``); else
    None."""
    path = path.rstrip("/")
    for directory in (path, path[:-len(_VARIABLES)] if path.endswith(_VARIABLES) else None):
        if directory and tf.io.gfile.isdir(directory) and any(
                tf.io.gfile.exists(f"{directory}/{name}")
                for name in ("keras_metadata.pb", "saved_model.pb", "config.json")):
            return directory
    return None


def _entry(archive):
    return json.loads(archive.read(ENTRY)) if ENTRY in archive.namelist() else None


def _write_dataset(path, dp):
    with h5py.File(path, "a") as f:
        if DATASET in f:
            del f[DATASET]
        if dp is not None:
            f.create_dataset(DATASET, data=np.frombuffer(json.dumps(dp).encode(), np.uint8))


def _paths(filepath):
    path = os.fspath(filepath) if isinstance(filepath, os.PathLike) else str(filepath)
    return path, path + SIDECAR_SUFFIX


def _local_hdf5(path):
    return "://" not in path and os.path.isfile(path) and h5py.is_hdf5(path)


def _dp_in_config(config):
    """The DP dict of the private optimizers in a whole model's saved config (``.keras``, an
    HDF5 file's training config, tf-keras SavedModel's metadata), or None."""
    found = []

    def visit(node):
        if isinstance(node, dict):
            named = saving.REGISTERED_NAME in (node.get("registered_name"), node.get("class_name"))
            if named and isinstance(node.get("config"), dict) and "dp" in node["config"]:
                found.append(node["config"]["dp"])
            for value in node.values():
                visit(value)
        elif isinstance(node, list):
            for value in node:
                visit(value)

    visit(config)
    return ledger_lineage.combined_dp(found)  # a plain model nesting several: all of them
