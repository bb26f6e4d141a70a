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
"""Saving and loading a private model: its DP settings travel with it, its key never does.

A private model's optimizer is *marked* when it is compiled into the model (or when
make_private meets it): its class becomes a subclass of its own class that

* applies only the DP engine's updates (a plain Keras ``fit`` of a model that has no
  DP step raises :class:`~tf_tempered.privacy.errors.NotPrivateError` with the fix,
  instead of training without privacy), and
* serializes as ``tf_tempered>PrivateOptimizer``: the optimizer's own config plus the
  model's DP settings, sampling, δ, accountant, engine options and privacy ledger
  (every DP step taken so far). Never the secret key.

So ``model.save("m.keras")`` (or ``.h5``, or a SavedModel with tf-keras) and
``keras.models.load_model`` give back a model whose optimizer refuses to train until
``make_private(model)`` is called again; called without arguments, it takes the
settings saved with the model, draws a fresh secret key, and keeps counting ε from
the saved ledger. A loaded model compiled anew before that (a plain optimizer in place
of the marked one) is refused too: the marked optimizer, once built on the loaded
weights (or around a compile: tf-keras' SavedModel does not build it), marks
them, and Keras' optimizers check for that mark before an update
(:mod:`~tf_tempered.privacy.update_guard`); make_private finds the saved settings there.
"""

import weakref

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered import keras_bridge
from tf_tempered.privacy import loaded_marks
from tf_tempered.privacy.errors import NotPrivateError

__all__ = ["PrivateOptimizer", "mark_optimizer", "bind_optimizer", "saved_dp",
           "release_loaded_variables", "refuse_loaded_updates", "is_marked",
           "PUBLIC_COPY_FIX", "REGISTERED_NAME"]

REGISTERED_NAME = "tf_tempered>PrivateOptimizer"

_REFUSAL = (
    "The optimizer {name} belongs to a model prepared by tf_tempered.make_private (it was "
    "compiled into one, or saved from one and loaded), and applies only the DP engine's "
    "updates; this model has no DP training step now, so it would train WITHOUT "
    "differential privacy. Fix: call tf_tempered.make_private(model) before fit (a "
    "loaded model: make_private(model) without arguments takes the DP settings saved "
    "with it and draws a fresh secret key).")


_REFUSAL_OWN_LOOP = (
    "The optimizer {name} is the one a private model (make_private) was compiled with: it "
    "applies only the updates of the model's own DP step (fit, train_on_batch), so that no "
    "other update reaches the model WITHOUT differential privacy. Fix: in a training loop of "
    "your own, apply the gradients of tf_tempered.privacy.DPGradients(model, ...) with an "
    "optimizer of your own (optimizer = keras.optimizers.SGD(...); "
    "optimizer.apply_gradients(zip(grads, model.trainable_variables))), not model.optimizer.")


class _Marked:
    """Mixin of a marked optimizer class (placed before the optimizer's own class)."""

    def _refuse_unless_engine(self):
        if not keras_bridge.dp_mark_is_set(self):
            bound = vars(self).get("_tf_tempered_describe")
            private = bound is not None and bound[0]() is not None  # its model's state lives
            raise NotPrivateError((_REFUSAL_OWN_LOOP if private else _REFUSAL).format(
                name=type(self).__name__))

    def get_config(self):
        return {"optimizer": keras_bridge.serialize_as(self, self._tf_tempered_base),
                "dp": saved_dp_of(self)}


class _MarkedKeras3(_Marked):
    def apply(self, grads, trainable_variables=None):
        """Applies the DP engine's update (marked by it); refuses any other."""
        self._refuse_unless_engine()
        result = super().apply(grads, trainable_variables)
        keras_bridge.clear_dp_mark(self)  # one mark, one update
        return result


class _MarkedKeras2(_Marked):
    def apply_gradients(self, grads_and_vars, *args, **kwargs):
        """Applies the DP engine's update (marked by it); refuses any other."""
        self._refuse_unless_engine()
        result = super().apply_gradients(grads_and_vars, *args, **kwargs)
        keras_bridge.clear_dp_mark(self)  # one mark, one update
        return result

    def minimize(self, *args, **kwargs):
        """Refuses: a Keras 2 train step without DP computes its gradients here."""
        del args, kwargs
        raise NotPrivateError(_REFUSAL.format(name=type(self).__name__))


_MIXIN = _MarkedKeras3 if KERAS_MAJOR == 3 else _MarkedKeras2
_MARKED_CLASSES = {}  # optimizer class -> its marked subclass


def _building(marked, name):
    """The marked class's ``name`` (its build: ``build``, or tf-keras' legacy
    ``_create_all_weights``): a loaded optimizer also marks the variables as its model's."""
    def build(self, var_list, *args, **kwargs):
        result = getattr(super(marked, self), name)(var_list, *args, **kwargs)
        _mark_loaded_variables(self, var_list)
        return result
    build.__name__ = name
    return build


def _marked_class(cls):
    if cls not in _MARKED_CLASSES:
        marked = type(f"Private{cls.__name__}", (_MIXIN, cls), {"_tf_tempered_base": cls})
        for name in ("build", "_create_all_weights"):  # only the build the class has:
            if hasattr(cls, name):                     # Keras probes optimizers for `build`
                setattr(marked, name, _building(marked, name))
        keras_bridge.class_registered_as(marked, REGISTERED_NAME)
        _MARKED_CLASSES[cls] = marked
    return _MARKED_CLASSES[cls]


def mark_optimizer(optimizer, *, saved=None):
    """Marks ``optimizer`` (idempotent); ``saved``: the DP dict it was loaded with."""
    if not isinstance(optimizer, _Marked):
        keras_bridge.swap_class(optimizer, _marked_class(type(optimizer)))
    keras_bridge.add_dp_mark(optimizer)
    if saved is not None:
        keras_bridge.set_untracked(optimizer, "_tf_tempered_saved_dp", saved)
    return optimizer


def bind_optimizer(model, state, describe):
    """Marks the model's compiled optimizer and ties what it saves to
    ``describe(state, optimizer)``."""
    optimizer = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
    if optimizer is None or isinstance(optimizer, str):
        return
    mark_optimizer(optimizer)
    keras_bridge.save_compiled_optimizer_object(model)
    keras_bridge.set_untracked(optimizer, "_tf_tempered_describe",
                               (weakref.ref(state), describe))


def saved_dp_of(optimizer):
    """The DP dict a marked optimizer saves: its model's now, else the one it was loaded with."""
    bound = vars(optimizer).get("_tf_tempered_describe")
    if bound is not None:
        state = bound[0]()
        if state is not None:
            return bound[1](state, optimizer)
    return vars(optimizer).get("_tf_tempered_saved_dp")




def _mark_loaded_variables(optimizer, variables):
    saved = vars(optimizer).get("_tf_tempered_saved_dp")
    if saved is not None and vars(optimizer).get("_tf_tempered_describe") is None:
        for variable in variables or []:
            for alias in keras_bridge.variable_aliases(variable):
                keras_bridge.set_untracked(alias, loaded_marks.LOADED, saved)
                if loaded_marks.loaded_how(alias) is None:
                    keras_bridge.set_untracked(alias, loaded_marks.HOW, _HOW_OPTIMIZER)


def _keep_the_loaded_dp(model):
    """Around a compile (the loader's, which gives a loaded model its marked optimizer, and
    one that replaces it): the DP dict that optimizer was loaded with goes on the model's
    weights, as the optimizer's build puts it (tf-keras' SavedModel loads the optimizer
    without building it on them). So a plain optimizer's update of them is refused (a new
    compile's, a tape loop's, a plain outer model's), and make_private, of the model or of
    an outer model holding it, finds the saved settings and ledger."""
    optimizer = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
    if isinstance(optimizer, _Marked):
        _mark_loaded_variables(optimizer, keras_bridge.existing_weights(model))


def saved_dp(model):
    """The DP dict saved with a loaded model (on its marked optimizer, or, once a plain one
    replaced it, on the variables that one was built on), or None."""
    found = saved_dps(model)
    return found[0] if found else None


def saved_dps(model):
    """Every distinct DP dict a model's loaded parts were saved with, its optimizer's
    first (a model built on the layers of two loaded private models has two)."""
    loaded_marks.mark_weights_built_since_load()
    found = loaded_marks.pending_dps(model)
    optimizer = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
    if isinstance(optimizer, _Marked) and vars(optimizer).get("_tf_tempered_saved_dp"):
        found.append(vars(optimizer).get("_tf_tempered_saved_dp"))
    for variable in keras_bridge.existing_weights(model):
        saved = loaded_marks.loaded_dp(variable)
        if saved is not None and not any(saved is seen for seen in found):
            found.append(saved)
    return found


def release_loaded_variables(model):
    """make_private took the DP dict the model was loaded with: its variables train as its
    own again (by its marked optimizer in fit, or by DPGradients' in a custom loop)."""
    loaded_marks.forget_pending(model)
    for variable in keras_bridge.existing_weights(model):
        loaded_marks.unmark(variable)


def is_marked(optimizer):
    """Whether ``optimizer`` (or the one a LossScaleOptimizer wraps) is a private model's:
    it applies only the DP engine's updates, refusing any other by itself."""
    return isinstance(keras_bridge.inner_optimizer(optimizer), _Marked)


def refuse_loaded_updates(optimizer, variables):
    """Refuses a plain optimizer's update of the variables of a private model loaded and
    not yet made private again (a recompile replaced its marked optimizer: it would train
    WITHOUT DP)."""
    loaded_marks.mark_weights_built_since_load()
    loaded = [v for v in variables if loaded_marks.is_loaded_weight(v)]
    if loaded:
        hows = sorted({loaded_marks.loaded_how(v) or _HOW_UNKNOWN for v in loaded})
        raise NotPrivateError(_REFUSAL_LOADED.format(name=type(optimizer).__name__,
                                                     how=" and ".join(hows)))


PUBLIC_COPY_FIX = (
    "To train these weights without DP on purpose (public data), copy them into a model "
    "make_private has not seen: build it anew with the code that built this one, then "
    "new_model.set_weights(model.get_weights()) (Keras 3's clone_model of a compiled "
    "private model copies its DP compile along).")

_HOW_UNKNOWN = "saved and loaded, or copied"
_HOW_OPTIMIZER = ("loaded by load_model, or copied by Keras 3's clone_model, with its DP "
                  "optimizer")

_REFUSAL_LOADED = (
    "The optimizer {name} would train weights of a private model ({how}) WITHOUT "
    "differential privacy, and without counting their privacy ledger: the model holding them "
    "was not made private since (or a new compile replaced its DP optimizer). Fix: call "
    "tf_tempered.make_private(model) (no arguments: the DP settings and ledger that came "
    "with them, a fresh secret key), then fit. " + PUBLIC_COPY_FIX)


@keras.utils.register_keras_serializable(package="tf_tempered", name="PrivateOptimizer")
class PrivateOptimizer:
    """What a private model's optimizer is saved as: see the module docstring.

    Loading gives back the optimizer itself (its own class, marked), never an instance
    of this class.
    """

    def get_config(self):
        raise NotImplementedError("PrivateOptimizer is a serialized form only.")

    @classmethod
    def from_config(cls, config):
        optimizer = keras_bridge.deserialize(config["optimizer"])
        return mark_optimizer(optimizer, saved=dict(config["dp"]))


keras_bridge.around_model_compiles(_keep_the_loaded_dp)
