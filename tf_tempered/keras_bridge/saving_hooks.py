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
"""A check before every save of a Keras model: ``model.save`` and the function
``keras.models.save_model`` (``keras.saving.save_model``), which share one implementation
(Keras' ``saving_api.save_model``) under several names; one around every compile; and
one after every ``save_weights`` and ``load_weights`` (Keras' ``saving_api`` functions,
which the Model methods call); one before a ``BackupAndRestore`` restores."""

import functools
import importlib
import inspect
import os

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["around_model_compiles", "guard_model_saves", "after_weight_files",
           "before_backup_restores"]

_CHECKS = []
_COMPILE_HOOKS = []
_WEIGHT_FILE_HOOKS = []
_RESTORE_CHECKS = []


def around_model_compiles(hook):
    """Makes every ``Model.compile`` call ``hook(model)`` first, while the model still holds
    the optimizer the compile replaces, and again after it (a loader's compile gives the
    model its saved optimizer). Installed once."""
    if _COMPILE_HOOKS:
        return
    _COMPILE_HOOKS.append(hook)
    owner = next(cls for cls in keras.Model.__mro__ if "compile" in vars(cls))
    original = owner.compile

    @functools.wraps(original)
    def compile(self, *args, **kwargs):  # pylint: disable=redefined-builtin
        hook(self)
        result = original(self, *args, **kwargs)
        hook(self)
        return result

    owner.compile = compile
# Modules holding Keras' save_model under its public names (Model.save calls the first's).
_MODULES = (("keras.src.saving.saving_api", "keras.models", "keras.saving") if KERAS_MAJOR == 3 else
            ("tf_keras.src.saving.saving_api", "tf_keras.models", "tf_keras.saving",
             "tf_keras.api._v2.keras.models", "tf_keras.api._v2.keras.saving"))


def guard_model_saves(check):
    """Makes every model save call ``check(model, filepath, include_optimizer)`` first
    (``check`` may warn or raise). Installed once."""
    if _CHECKS:
        return
    _CHECKS.append(check)
    original = importlib.import_module(_MODULES[0]).save_model

    def save_model(model, filepath, *args, **kwargs):
        check(model, filepath, kwargs.get("include_optimizer", True))
        return original(model, filepath, *args, **kwargs)

    save_model.__doc__ = original.__doc__
    save_model.__wrapped__ = original
    for name in _MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # a Keras without that public name
            continue
        if getattr(module, "save_model", None) is original:
            module.save_model = save_model


# Modules holding Keras' save_weights/load_weights (the Model methods call the first's).
_WEIGHTS_MODULES = (("keras.src.saving.saving_api", "keras.saving") if KERAS_MAJOR == 3 else
                    ("tf_keras.src.saving.saving_api",))


def after_weight_files(saved, loaded):
    """Makes every ``save_weights`` call ``saved(model, filepath)`` once the file is
    written, and every ``load_weights`` call ``loaded(model, filepath, by_name=...,
    skip_mismatch=...)`` once the weights are in the model. Installed once."""
    if _WEIGHT_FILE_HOOKS:
        return
    _WEIGHT_FILE_HOOKS.append((saved, loaded))
    api = importlib.import_module(_WEIGHTS_MODULES[0])
    originals = api.save_weights, api.load_weights

    def save_weights(model, filepath, *args, **kwargs):
        overwrite = kwargs.get("overwrite", args[0] if args else True)
        before = None if overwrite else _written_state(filepath)
        result = originals[0](model, filepath, *args, **kwargs)
        if overwrite or before is None or _written_state(filepath) != before:
            saved(model, filepath)  # not when Keras asked and was told not to overwrite
        return result

    def load_weights(model, filepath, *args, **kwargs):
        result = originals[1](model, filepath, *args, **kwargs)
        arguments = inspect.signature(originals[1]).bind(model, filepath, *args, **kwargs)
        given = {**arguments.arguments.get("kwargs", {}), **arguments.arguments}
        loaded(model, filepath, by_name=bool(given.get("by_name")),
               skip_mismatch=bool(given.get("skip_mismatch")))
        return result

    for wrapper, original in zip((save_weights, load_weights), originals):
        wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original
        for name in _WEIGHTS_MODULES:
            module = importlib.import_module(name)
            if getattr(module, original.__name__, None) is original:
                setattr(module, original.__name__, wrapper)


def _written_state(filepath):
    """(modification time, size) of the file a save_weights to ``filepath`` writes (a TF
    checkpoint: its index), or None when there is none yet."""
    path = os.fspath(filepath) if isinstance(filepath, os.PathLike) else str(filepath)
    for candidate in (path, path + ".index"):
        if tf.io.gfile.exists(candidate) and not tf.io.gfile.isdir(candidate):
            stat = tf.io.gfile.stat(candidate)
            return candidate, stat.mtime_nsec, stat.length
    return None


def before_backup_restores(check):
    """Makes every ``keras.callbacks.BackupAndRestore`` call ``check(callback)`` at the start
    of a fit, before it restores a backup (tf-keras restores through tf.train.Checkpoint,
    not ``load_weights``). Installed once."""
    if _RESTORE_CHECKS:
        return
    _RESTORE_CHECKS.append(check)
    original = keras.callbacks.BackupAndRestore.on_train_begin

    @functools.wraps(original)
    def on_train_begin(self, logs=None):
        check(self)
        return original(self, logs)

    keras.callbacks.BackupAndRestore.on_train_begin = on_train_begin
