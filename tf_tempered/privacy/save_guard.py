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
"""Saves that lose a private model's DP settings and ledger are warned about.

A private model's file carries its DP settings and privacy ledger with its optimizer
(:mod:`~tf_tempered.privacy.saving`): a model loaded from it refuses to train until
``make_private(loaded)``, which goes on counting ε. Two saves lose them, and a model
loaded from such a file trains without DP unless made private again, counting ε from 0:

* a private model saved without its optimizer (``include_optimizer=False``; Keras 3's
  ``.keras`` format always saves it);
* a plain model holding a private model's weights (a trained private model nested in a
  new outer model) saved where the nested model's optimizer is not saved: tf-keras, any
  format, and Keras 3's H5 (Keras 3's ``.keras`` saves it, and the loaded outer model
  refuses to train until made private);
* a plain model holding weights loaded from a private model's weights file
  (:mod:`.weight_files`), any format: its own optimizer carries no DP dict.

Both are fine for a model that serves predictions; the warnings name how to keep training.
A save to a local path keeps the DP dict in the file instead (:mod:`.model_files`): these
warnings are for the others (a file object, a remote path).
"""

import warnings

from tf_tempered._compat import KERAS_MAJOR
from tf_tempered import keras_bridge
from tf_tempered.privacy import dp_in_files, loaded_marks, saving, update_guard
from tf_tempered.privacy.state import get_state

__all__ = ["warn_saves_without_dp"]

_SAVED_WITHOUT_OPTIMIZER = (
    "A private model saved with include_optimizer=False: the file keeps neither its DP "
    "settings nor its privacy ledger, so a model loaded from it trains without DP unless "
    "made private again, and counts ε from 0 (what these weights spent is lost). Fine for "
    "a model to serve predictions; to train it on, save it with its optimizer (the "
    "default).")

_SAVED_INSIDE_A_PLAIN_MODEL = (
    "Model {name!r} holds the weights of a private model (make_private) but is not private "
    "itself, and this save keeps no nested model's optimizer (tf-keras, or an H5 file): the "
    "file keeps neither the DP settings nor the privacy ledger of those weights, so a model "
    "loaded from it trains them WITHOUT DP, and make_private on it counts ε from 0. Fine "
    "for a model to serve predictions; to train it on, make it private before saving "
    "(make_private({name}, l2_norm_clip=..., noise_multiplier=...): its ε goes on counting "
    "the steps those weights took), or save the private model itself.")


_SAVED_LOADED_WEIGHTS = (
    "Model {name!r} holds weights loaded from a private model's weights file (load_weights) "
    "and is not private itself: this save keeps neither their DP settings nor their privacy "
    "ledger, so a model loaded from it trains them WITHOUT DP, and make_private on it counts "
    "ε from 0. Fine for a model to serve predictions; to train it on, make_private({name}) "
    "before saving (no arguments: the settings loaded with the weights), or save its weights "
    "(save_weights keeps them).")


def warn_saves_without_dp(model, filepath, include_optimizer):
    """Warns before a save that loses a private model's DP settings (module docstring)."""
    if dp_in_files.writable(filepath):
        return  # the file keeps them (model_files)
    h5 = str(filepath).endswith((".h5", ".hdf5"))
    optimizer_kept = include_optimizer is not False or (KERAS_MAJOR == 3 and not h5)
    name = getattr(model, "name", "model")
    if get_state(model) is not None:
        if not optimizer_kept:
            warnings.warn(_SAVED_WITHOUT_OPTIMIZER, UserWarning, stacklevel=4)
        return
    weights = keras_bridge.existing_weights(model)
    if (KERAS_MAJOR == 2 or h5 or not optimizer_kept) and any(
            update_guard.is_private_weight(v) for v in weights):
        warnings.warn(_SAVED_INSIDE_A_PLAIN_MODEL.format(name=name), UserWarning, stacklevel=4)
    elif not (optimizer_kept and saving.is_marked(getattr(model, "optimizer", None))) and any(
            loaded_marks.is_loaded_weight(v) for v in weights):
        warnings.warn(_SAVED_LOADED_WEIGHTS.format(name=name), UserWarning, stacklevel=4)



# Installed once, as update_guard installs its guard: the check reads the weights' tags, so
# it warns only once a model was made private.
keras_bridge.guard_model_saves(warn_saves_without_dp)
