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
"""What make_private checks before it prepares a model: the model is one it can prepare
(the active Keras's, no train_step override of its own, not in its own fit), and whether
its optimizer already trained it without DP (a warning: fine after public pre-training)."""

import contextlib
import contextvars
import warnings

from tf_tempered._compat import check_same_keras, keras
from tf_tempered import keras_bridge
from tf_tempered.privacy import fit_in_progress, loaded_marks
from tf_tempered.privacy.state import get_state

__all__ = ["checked_model", "training_overrides_allowed", "warn_if_trained_without_dp"]

# True inside training_overrides_allowed() (DPGradients).
_OVERRIDES_ALLOWED = contextvars.ContextVar("tf_tempered_overrides_allowed", default=False)


def checked_model(model):
    """The PrivateState of ``model`` from an earlier make_private (or None), once ``model``
    passed the checks (module docstring); raises naming the fix otherwise."""
    check_same_keras(model, "make_private's model")
    if not isinstance(model, keras.Model):
        raise TypeError(f"make_private expects a keras.Model, got {type(model).__name__}.")
    _refuse_training_overrides(model)
    fit_in_progress.refuse_during_own_fit(model, "make_private", why=_DURING_FIT,
                                          fix=_DURING_FIT_FIX)
    return get_state(model)


def _refuse_training_overrides(model):
    """A model class's own train_step would be silently replaced by the DP step (which
    takes each example's loss from compile's loss, or a compute_loss override): refused."""
    owner = keras_bridge.overriding_class(model, "train_step")
    if owner is not None and not _OVERRIDES_ALLOWED.get():
        raise TypeError(
            f"{owner}.train_step would not run: a private model's fit runs the DP step, which "
            "computes each example's loss from the loss given to compile (or a compute_loss "
            "override returning one loss per example). Fix: drop the train_step override, or "
            "train with a loop of your own that takes its gradients from "
            "tf_tempered.privacy.DPGradients(model, loss, l2_norm_clip=..., "
            "noise_multiplier=...) (docs/custom_loops.md).")


@contextlib.contextmanager
def training_overrides_allowed():
    """Within it, make_private prepares a model whose class overrides train_step
    (DPGradients: the caller's loop calls the DP step; fit still runs the DP step)."""
    token = _OVERRIDES_ALLOWED.set(True)
    try:
        yield
    finally:
        _OVERRIDES_ALLOWED.reset(token)


# Keras' fit loop holds the step it traced; make_private drops it (a new key), and the fit's
# next batch found none ("'NoneType' object is not callable").
_DURING_FIT = "the fit runs the step it traced with the settings it started with"
_DURING_FIT_FIX = (
    "change the settings between fits, e.g. model.fit(..., epochs=k), then "
    "make_private(model, noise_multiplier=...), then model.fit(..., initial_epoch=k, "
    "epochs=n); ε counts every fit")


_TRAINED_BEFORE = (
    "make_private on a model whose optimizer has already applied {updates} updates without "
    "DP: ε counts the DP steps from now on only. If those updates used the training data "
    "the private fit will use, no ε holds for it (fix: start from the weights before that "
    "training, or a fresh model); if they used public data (pre-training), this is the "
    "intended use.")


def warn_if_trained_without_dp(model):
    """Warns when the compiled optimizer has taken steps before the model was private."""
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    try:
        updates = int(iterations.numpy()) if iterations is not None else 0
    except (AttributeError, TypeError, ValueError):
        return
    # Keras 3's load_weights restores the count of a private model's file: its DP steps,
    # in the ledger loaded with them (they were warned of as plain updates; probe P, 3).
    updates -= loaded_marks.loaded_iterations(optimizer)
    if updates > 0:
        warnings.warn(_TRAINED_BEFORE.format(updates=updates), UserWarning, stacklevel=3)
