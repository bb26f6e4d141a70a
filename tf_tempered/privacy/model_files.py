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
"""A whole model's save keeps the DP dict of the private weights it holds, wherever its
optimizer does not.

A private model's ``model.save`` keeps its DP settings and ledger in its optimizer's config
(:mod:`.saving`). Three saves used to lose them (and only warned): a plain model holding a
private model's weights (a head on a private encoder) where the nested optimizer is not
saved (tf-keras, any ``.h5``), a plain model holding weights loaded from a private model's
weights file, and a private model saved with ``include_optimizer=False``; and a private
model's file loaded with ``compile=False`` trained them without DP. Their file now keeps the
DP dict (:func:`.dp_in_files.write_model_dp`: the ``.keras`` entry, the HDF5
dataset, the SavedModel's file), and ``load_model`` gives it (or, with ``compile=False``,
the one in the private optimizer's config) to the loaded model's weights
as ``load_weights`` does (:func:`.weight_files.apply_loaded_dp`): a plain update of them is
refused, and ``make_private(loaded)`` takes the settings and goes on counting ε. A save
where it cannot (a file object, a remote path) still warns (:mod:`.save_guard`). An export
(``Model.export``) keeps it too, and a layer reloading the export to train
(``TFSMLayer(..., trainable=True)``) gets the mark.
"""

import contextlib
import warnings

from tf_tempered import keras_bridge
from tf_tempered._compat import KERAS_MAJOR
from tf_tempered.privacy import dp_in_files, loaded_marks, recording, saving, weight_files
from tf_tempered.privacy.state import get_state

__all__ = ["dp_to_carry"]


def dp_to_carry(model, include_optimizer=True):
    """The DP dict a whole-model save of ``model`` must keep beside its optimizer's config,
    or None (nothing private, or a private model whose saved optimizer keeps it)."""
    if get_state(model) is not None and include_optimizer is not False:
        return None
    return weight_files.dp_to_save(model)


@contextlib.contextmanager
def _calls_as_defined(model):
    """tf-keras' SavedModel traces each layer's ``call`` (a save in another format ignores
    this): the recording function make_private set on the layer (:mod:`.recording`) made it
    trace the class's unbound ``call`` ("missing a required argument: 'inputs'"). Lifted
    while the model is saved; outside a DP step it only calls the layer's own."""
    lifted = [(layer, name, vars(layer)[name])
              for layer in (keras_bridge.flatten_layers(model) if KERAS_MAJOR == 2 else ())
              for name in recording.RECORDED_METHODS if name in vars(layer)]
    for layer, name, _ in lifted:
        object.__delattr__(layer, name)
    try:
        yield
    finally:
        for layer, name, call in lifted:
            keras_bridge.set_untracked(layer, name, call)


def _saved(model, filepath, include_optimizer=True):
    dp = dp_to_carry(model, include_optimizer)
    if dp is None and get_state(model) is not None and dp_in_files.writable(filepath) and (
            dp_in_files.read_dp(filepath) is None):
        # The file lost its optimizer's config all the same: Keras 3's legacy .h5 save drops
        # "optimizer" from the model's compile config in place, and a later .keras save of
        # the model writes none.
        dp = weight_files.dp_to_save(model)
    # (None: a directory saved into again loses an earlier private save's file)
    if not dp_in_files.write_model_dp(filepath, dp) and dp is not None:
        warnings.warn(_NOT_KEPT.format(path=str(filepath)), UserWarning, stacklevel=4)


_NOT_KEPT = (
    "model.save({path!r}): this model's weights are (or were trained by) a private model's, and "
    "this file's format cannot keep their DP settings and privacy ledger: a model loaded from "
    "it trains them WITHOUT DP and counts ε from 0. Save to a .keras or .h5 file (or, with "
    "tf-keras, a SavedModel directory), or make_private the model again after loading it.")


def _loaded(model, filepath):
    # Compiled from the file, a private model's optimizer marks its weights itself (saving);
    # loaded with compile=False (or without its optimizer), the dict its config keeps counts.
    own = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
    dp = (dp_in_files.read_model_dp(filepath) if saving.is_marked(own)
          else dp_in_files.read_dp(filepath))
    if dp is not None:
        weight_files.apply_loaded_dp(model, dp, how="loaded by load_model")


def _exported(model, filepath):
    """``Model.export`` (a SavedModel for serving) keeps the DP dict of a private model, or
    of the private weights a plain one holds, for a layer reloading it to train
    (``TFSMLayer(..., trainable=True)``: :func:`_reloaded`)."""
    dp = weight_files.dp_to_save(model)
    if dp is not None and not dp_in_files.write_model_dp(filepath, dp):
        warnings.warn(_NOT_KEPT.format(path=str(filepath)), UserWarning, stacklevel=4)


def _reloaded(layer, filepath):
    """A layer reloading an export of private weights: they are marked, as load_model's."""
    dp = dp_in_files.read_model_dp(filepath)
    if dp is not None:
        loaded_marks.mark_loaded_weights(keras_bridge.existing_weights(layer), dp,
                                         f"reloaded from an export by {type(layer).__name__}")


def _load_failed(error):
    """tf-keras cannot load a mixed-precision private model's ``.h5`` with its optimizer
    (its LossScaleOptimizer saves the inner one by its class name, ``Private<Name>``): the
    error names the way that works."""
    text = str(error)
    if "Unknown optimizer" in text and "'Private" in text:
        return ValueError(_MIXED_H5.format(error=text.split(".")[0]))
    return None


_MIXED_H5 = (
    "{error}: this file holds a private model's optimizer inside a LossScaleOptimizer (mixed "
    "precision), which tf-keras' .h5 loader cannot rebuild. Fix: load_model(path, "
    "compile=False), then make_private(model) (no arguments: the DP settings and ledger "
    "saved with it; ε goes on counting) and compile; or save to .keras or a SavedModel "
    "directory, which load with it.")


keras_bridge.around_model_files(_calls_as_defined, _saved, _loaded, _load_failed)
keras_bridge.after_exports(_exported, _reloaded)
