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
"""A check before every save of a Keras model (``model.save`` and the function
``keras.models.save_model``/``keras.saving.save_model``, which share one implementation,
Keras' ``saving_api.save_model``, under several names) and a hook after it and after every
``load_model``; one around every compile; one after every ``save_weights`` and
``load_weights`` (Keras' ``saving_api`` functions, which the Model methods call); hooks
around a ``BackupAndRestore``'s restore and end."""

import functools
import importlib
import inspect
import json
import os

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["around_model_compiles", "guard_model_saves", "around_model_files",
           "after_weight_files", "around_backup_restores", "after_exports",
           "saved_model_metadata"]

_CHECKS = []
_COMPILE_HOOKS = []
_WEIGHT_FILE_HOOKS = []
_RESTORE_CHECKS = []
_MODEL_FILE_HOOKS = []
_EXPORT_HOOKS = []


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

    def wrap(original):
        def save_model(model, filepath, *args, **kwargs):
            check(model, filepath, kwargs.get("include_optimizer", True))
            return original(model, filepath, *args, **kwargs)
        return save_model

    _replace_in_modules(_MODULES, "save_model", wrap)


def around_model_files(saving, saved, loaded, load_failed):
    """Makes every model save run inside the context ``saving(model)`` and call
    ``saved(model, filepath, include_optimizer)`` once the file is written, and every
    ``load_model`` call ``loaded(model, filepath)`` with the model it returns, or, when it
    raises a ValueError, raise ``load_failed(error)`` instead if that is not None. Installed
    once."""
    if _MODEL_FILE_HOOKS:
        return
    _MODEL_FILE_HOOKS.append((saving, saved, loaded, load_failed))

    def wrap_save(original):
        def save_model(model, filepath, *args, **kwargs):
            with saving(model):
                result = original(model, filepath, *args, **kwargs)
            saved(model, filepath, kwargs.get("include_optimizer", True))
            return result
        return save_model

    def wrap_load(original):
        def load_model(filepath, *args, **kwargs):
            try:
                model = original(filepath, *args, **kwargs)
            except ValueError as error:
                better = load_failed(error)
                if better is None:
                    raise
                raise better from error
            loaded(model, filepath)
            return model
        return load_model

    _replace_in_modules(_MODULES, "save_model", wrap_save)
    _replace_in_modules(_MODULES, "load_model", wrap_load)


def _replace_in_modules(modules, name, wrap):
    """Replaces the function ``name`` of ``modules[0]`` by ``wrap(it)`` there and in the
    other ``modules`` holding it (its public names)."""
    original = getattr(importlib.import_module(modules[0]), name)
    wrapper = wrap(original)
    wrapper.__doc__, wrapper.__wrapped__ = original.__doc__, original
    for module_name in modules:
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a Keras without that public name
            continue
        if getattr(module, name, None) is original:
            setattr(module, name, wrapper)


# Modules holding Keras' save_weights/load_weights (the Model methods call the first's).
_WEIGHTS_MODULES = (("keras.src.saving.saving_api", "keras.saving") if KERAS_MAJOR == 3 else
                    ("tf_keras.src.saving.saving_api",))


def after_weight_files(saved, loaded):
    """Makes every ``save_weights`` call ``saved(model, filepath)`` once the file is
    written, and every ``load_weights`` call ``loaded(model, filepath, by_name=...,
    skip_mismatch=..., updates_before=...)`` once the weights are in the model
    (``updates_before``: the model's optimizer's update count before the load, or None).
    Installed once."""
    if _WEIGHT_FILE_HOOKS:
        return
    _WEIGHT_FILE_HOOKS.append((saved, loaded))

    def wrap_save(original):
        def save_weights(model, filepath, *args, **kwargs):
            overwrite = kwargs.get("overwrite", args[0] if args else True)
            before = None if overwrite else _written_state(filepath)
            result = original(model, filepath, *args, **kwargs)
            if overwrite or before is None or _written_state(filepath) != before:
                saved(model, filepath)  # not when Keras asked and was told not to overwrite
            return result
        return save_weights

    def wrap_load(original):
        def load_weights(model, filepath, *args, **kwargs):
            updates_before = _updates(getattr(model, "optimizer", None))
            result = original(model, filepath, *args, **kwargs)
            arguments = inspect.signature(original).bind(model, filepath, *args, **kwargs)
            given = {**arguments.arguments.get("kwargs", {}), **arguments.arguments}
            loaded(model, filepath, by_name=bool(given.get("by_name")),
                   skip_mismatch=bool(given.get("skip_mismatch")), updates_before=updates_before)
            return result
        return load_weights

    _replace_in_modules(_WEIGHTS_MODULES, "save_weights", wrap_save)
    _replace_in_modules(_WEIGHTS_MODULES, "load_weights", wrap_load)


def _updates(optimizer):
    """An optimizer's update count (``iterations``), or None when it has none to read."""
    try:
        return int(optimizer.iterations.numpy())
    except (AttributeError, TypeError, ValueError):
        return None


def _written_state(filepath):
    """(modification time, size) of the file a save_weights to ``filepath`` writes (a TF
    checkpoint: its index), or None when there is none yet."""
    path = os.fspath(filepath) if isinstance(filepath, os.PathLike) else str(filepath)
    for candidate in (path, path + ".index"):
        if tf.io.gfile.exists(candidate) and not tf.io.gfile.isdir(candidate):
            stat = tf.io.gfile.stat(candidate)
            return candidate, stat.mtime_nsec, stat.length
    return None


def around_backup_restores(before, after, ended, backing_up):
    """Makes every ``keras.callbacks.BackupAndRestore`` call ``before(callback)`` at the start
    of a fit, before it restores a backup (tf-keras restores through tf.train.Checkpoint,
    not ``load_weights``), ``after(callback)`` once it has, ``ended(callback)`` when the
    fit ends, before it deletes the backup, and, on tf-keras, ``backing_up(callback)``
    before each backup it writes. Installed once."""
    if _RESTORE_CHECKS:
        return
    _RESTORE_CHECKS.append((before, after, ended, backing_up))
    cls = keras.callbacks.BackupAndRestore
    begin, end = cls.on_train_begin, cls.on_train_end

    @functools.wraps(begin)
    def on_train_begin(self, logs=None):
        before(self)
        result = begin(self, logs)
        after(self)
        return result

    @functools.wraps(end)
    def on_train_end(self, logs=None):
        ended(self)
        return end(self, logs)

    cls.on_train_begin, cls.on_train_end = on_train_begin, on_train_end
    if KERAS_MAJOR == 2:  # its one method writing a backup (every save_freq)
        backup = cls._backup  # pylint: disable=protected-access

        @functools.wraps(backup)
        def _backup(self, *args, **kwargs):
            backing_up(self)
            return backup(self, *args, **kwargs)

        cls._backup = _backup  # pylint: disable=protected-access


def after_exports(exported, reloaded):
    """Makes every ``Model.export`` call ``exported(model, filepath)`` once it is written, and
    every layer reloading an export (Keras 3's ``TFSMLayer``, tf-keras' ``ReloadedLayer``)
    call ``reloaded(layer, filepath)`` once made. Installed once."""
    if _EXPORT_HOOKS:
        return
    _EXPORT_HOOKS.append((exported, reloaded))
    owner = next(cls for cls in keras.Model.__mro__ if "export" in vars(cls))
    export = owner.export

    @functools.wraps(export)
    def export_and_record(self, filepath, *args, **kwargs):
        result = export(self, filepath, *args, **kwargs)
        exported(self, filepath)
        return result

    owner.export = export_and_record
    if KERAS_MAJOR == 3:
        from keras.src.export.tfsm_layer import TFSMLayer as reloading  # pylint: disable=g-import-not-at-top
    else:
        from tf_keras.src.export.export_lib import ReloadedLayer as reloading  # pylint: disable=g-import-not-at-top
    init = reloading.__init__

    @functools.wraps(init)
    def init_and_record(self, filepath, *args, **kwargs):
        init(self, filepath, *args, **kwargs)
        reloaded(self, filepath)

    # Keras 3 reads a layer's arguments off its __init__'s signature (getfullargspec, which
    # does not follow __wrapped__): the original's.
    init_and_record.__signature__ = inspect.signature(init)
    reloading.__init__ = init_and_record


def saved_model_metadata(directory):
    """The Keras metadata of each object of the tf-keras SavedModel in ``directory``, as
    dicts (the root's holds the training config), or [] (none there, or Keras 3, whose
    ``load_weights`` reads no SavedModel)."""
    found = f"{str(directory).rstrip('/')}/keras_metadata.pb"
    if KERAS_MAJOR == 3 or not tf.io.gfile.exists(found):
        return []
    from tf_keras.protobuf import saved_metadata_pb2  # pylint: disable=g-import-not-at-top
    metadata = saved_metadata_pb2.SavedMetadata()
    with tf.io.gfile.GFile(found, "rb") as f:
        metadata.ParseFromString(f.read())
    return [json.loads(node.metadata) for node in metadata.nodes if node.metadata]
