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
"""What the white-box and black-box one-run audits share: the audited model and the result.

The audit trains a model of its own, built by the caller's ``model_fn`` and made
private with :func:`tf_tempered.make_private`; it never touches a model meant for
release (white-box canaries enter its gradients). ``fit`` on arrays draws Poisson
batches, so the accounted ε (:func:`tf_tempered.privacy.epsilon_spent`) is the
amplified one, at the same q the canaries see.
"""

import dataclasses
import math
import secrets
from typing import Any

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.audit import one_run
from tf_tempered.privacy import epsilon_spent, make_private
from tf_tempered.privacy.state import get_state

__all__ = ["OneRunResult", "secret_inclusion", "audit_model", "compiled_loss",
           "EpochProgress", "check_positive", "finite_scores", "result_of"]


@dataclasses.dataclass(frozen=True)
class OneRunResult:
    """One one-run audit: both ε lower bounds, the ROC summary, and the accounted ε.

    ``audit``: :class:`~tf_tempered.audit.one_run.OneRunAudit` (``.one_run`` is
    Steinke et al.'s bound, ``.one_run_fdp`` the Gaussian f-DP one, each holding with
    probability ≥ 1 − significance); ``epsilon``: the accounted ε at ``delta``;
    ``in_scores``/``out_scores``: the canaries' scores, split after scoring by the
    secret inclusion; ``settings``: the run's settings (JSON-ready).
    """

    kind: str
    audit: Any
    epsilon: float
    delta: float
    num_canaries: int
    steps: int
    in_scores: np.ndarray
    out_scores: np.ndarray
    settings: dict
    history: dict

    def summary(self):
        """One line: accounted ε, both lower bounds with their confidence, AUC."""
        confidence = 100 * (1 - self.audit.one_run.significance)
        tprs = ", ".join(f"TPR@{100 * f:g}%FPR {t:.3f}" for f, t in self.audit.tpr_at_fpr.items())
        return (f"{self.kind}: accounted ε {self.epsilon:.3f} (δ {self.delta:g}); ε lower "
                f"bound at {confidence:g}% confidence: {self.audit.one_run.epsilon:.3f} "
                f"(Steinke et al.), {self.audit.one_run_fdp.epsilon:.3f} (f-DP Gaussian); "
                f"{self.num_canaries} canaries, {self.steps} steps; AUC {self.audit.auc:.3f}, "
                f"{tprs}")

    def to_dict(self):
        """JSON-ready (no score arrays)."""
        def bound(b):
            return {"epsilon": b.epsilon, "num_guesses": b.num_guesses,
                    "num_correct": b.num_correct, "threshold": _finite(b.threshold),
                    "num_thresholds": b.num_thresholds, "significance": b.significance}
        return {"kind": self.kind, "epsilon_accounted": _finite(self.epsilon),
                "delta": self.delta, "num_canaries": self.num_canaries,
                "num_included": int(len(self.in_scores)), "steps": self.steps,
                "epsilon_lb_steinke": bound(self.audit.one_run),
                "epsilon_lb_fdp": bound(self.audit.one_run_fdp), "auc": self.audit.auc,
                "tpr_at_fpr": {str(f): t for f, t in self.audit.tpr_at_fpr.items()},
                "settings": self.settings, "history": self.history}


def _finite(value):
    return None if value is None or math.isinf(value) else float(value)


def secret_inclusion(num_canaries):
    """m independent fair bits from the OS's entropy (never a seed): who is "in"."""
    return (np.frombuffer(secrets.token_bytes(num_canaries), np.uint8) & 1).astype(bool)


def check_positive(name, value, *, integer=False):
    """``value``, or ValueError naming ``name`` if it is not a positive (integer) number."""
    bad = isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
    if bad or not value > 0 or (integer and int(value) != value):
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, got {value!r}.")
    return int(value) if integer else float(value)


def audit_model(model_fn, x, *, l2_norm_clip, noise_multiplier, delta):
    """A fresh model from ``model_fn()``, built on ``x[:1]`` and made private."""
    model = model_fn()
    if not isinstance(model, keras.Model):
        raise TypeError(f"model_fn must return a Keras model of the active Keras, got "
                        f"{type(model).__name__}.")
    if get_state(model) is not None:
        raise ValueError("model_fn returned a model make_private has already prepared. The "
                         "audit trains a fresh model of its own (never a model meant for "
                         "release). Fix: build a new model in each call of model_fn.")
    if not model.built or not model.trainable_variables:
        model(x[:1])
    return make_private(model, l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                        delta=delta)


def compiled_loss(model, loss):
    """``loss``, or the loss ``model_fn`` compiled the model with; ValueError if neither."""
    if loss is None:
        loss = getattr(model, "loss", None)
    if loss is None:
        raise ValueError("no loss: model_fn returned an uncompiled model and loss= was not "
                         "given. Fix: pass loss=... (e.g. keras.losses."
                         "SparseCategoricalCrossentropy(from_logits=True)), or compile the "
                         "model in model_fn.")
    return loss


class EpochProgress(keras.callbacks.Callback):
    """Logs one line per epoch: the epoch's loss (and metrics) and the ε spent so far."""

    def __init__(self, name, epochs, log=print):
        super().__init__()
        self.name, self.epochs, self.log = name, epochs, log
        self.history = {}

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        for key, value in logs.items():
            self.history.setdefault(key, []).append(float(value))
        shown = ", ".join(f"{k} {float(v):.4g}" for k, v in logs.items()
                          if not k.startswith("dp_") and k != "delta")
        if self.log is not None:
            self.log(f"[{self.name}] epoch {epoch + 1}/{self.epochs}: {shown}")


def finite_scores(scores):
    """``scores`` with NaN lowest and ±inf at the float64 extremes: the same ranking, which
    the estimators need finite (a diverged run, e.g. of a broken engine, gives inf)."""
    scores = np.asarray(scores, np.float64)
    top = np.finfo(np.float64).max
    return np.nan_to_num(scores, nan=-top, posinf=top, neginf=-top)


def result_of(kind, model, scores, included, *, significance, fprs, steps, settings,
              history):
    """The OneRunResult of ``scores`` (fixed before ``included`` is read) and ``model``'s ε."""
    epsilon, delta = epsilon_spent(model)
    scores = finite_scores(scores)
    audit = one_run.one_run_audit(scores[included], scores[~included],
                                  significance=significance, delta=delta, fprs=fprs)
    return OneRunResult(kind=kind, audit=audit, epsilon=float(epsilon), delta=float(delta),
                        num_canaries=int(scores.size), steps=int(steps),
                        in_scores=scores[included], out_scores=scores[~included],
                        settings=settings, history=history)
