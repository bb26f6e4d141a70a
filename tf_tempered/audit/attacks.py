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
"""Membership-inference attacks on a classifier's logits (NumPy/SciPy only).

Threshold attacks score each example by how well the model fits it: ``-loss``
(loss attack, Yeom et al. 2018) or the top softmax probability max_j p_j
(label-free confidence attack, Salem et al. 2019). The likelihood-ratio attack
LiRA (Carlini et al. 2022) instead compares the target model's logit-scaled
confidence

    φ = log(p_y / (1 − p_y)) = z_y − logsumexp_{j≠y} z_j

with Gaussians fitted, per example, to φ under shadow models trained with
("in") and without ("out") that example:

* online: score = log N(φ; μ_in, σ_in²) − log N(φ; μ_out, σ_out²);
* offline: score = (φ − μ_out) / σ_out, a monotone transform of the one-sided
  test 1 − P[Z > φ], Z ~ N(μ_out, σ_out²) (needs out-models only).

Every score is "higher = more likely a member", as :mod:`.metrics` expects.

>>> logits = np.array([[4.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
>>> np.round(per_example_loss(logits, [0, 0]), 3)
array([0.036, 1.099])
>>> np.round(logit_scaled_confidence(logits, [0, 0]), 4)
array([ 3.3069, -0.6931])
"""

import dataclasses

import numpy as np
from scipy import special

from tf_tempered.audit import metrics

__all__ = ["DEFAULT_FPRS", "AttackResult", "log_softmax", "per_example_loss",
           "true_class_confidence", "logit_scaled_confidence", "max_confidence_score",
           "threshold_attack", "loss_attack", "confidence_attack", "balanced_keep",
           "shadow_scores", "lira_scores", "lira_attack"]

DEFAULT_FPRS = (0.001, 0.01)


@dataclasses.dataclass(frozen=True)
class AttackResult:
    """One attack's ROC and summary: AUC, advantage, TPR at fixed FPRs, ε lower bounds.

    ``epsilon_lb``: max over all thresholds (:func:`metrics.epsilon_lower_bound`);
    ``epsilon_lb_split``: threshold chosen on held-out halves
    (:func:`metrics.split_epsilon_lower_bound`), free of selection bias.
    """

    name: str
    roc: metrics.RocCurve
    auc: float
    advantage: float
    tpr_at: dict
    epsilon_lb: metrics.EpsilonLowerBound
    epsilon_lb_split: metrics.EpsilonLowerBound

    def __str__(self):
        tprs = ", ".join(f"TPR@{100 * f:g}%={t:.3f}" for f, t in self.tpr_at.items())
        return (f"{self.name}: AUC={self.auc:.3f}, advantage={self.advantage:.3f}, {tprs}, "
                f"eps_lb={self.epsilon_lb.epsilon:.3f}")


def _logits_labels(logits, labels):
    logits = np.asarray(logits, dtype=np.float64)
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    if logits.ndim != 2 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"need logits [N, num_classes] and labels [N], got shapes "
                         f"{logits.shape} and {labels.shape}.")
    if labels.size and (labels.min() < 0 or labels.max() >= logits.shape[1]):
        raise ValueError(f"labels must be class indices in [0, {logits.shape[1]}), got "
                         f"values in [{labels.min()}, {labels.max()}].")
    return logits, labels


def log_softmax(logits):
    """log softmax over the last axis, computed stably.

    >>> np.round(np.exp(log_softmax([[0.0, 0.0]])), 2)
    array([[0.5, 0.5]])
    """
    logits = np.asarray(logits, dtype=np.float64)
    return logits - special.logsumexp(logits, axis=-1, keepdims=True)


def per_example_loss(logits, labels):
    """Cross-entropy −log p_y of each example."""
    logits, labels = _logits_labels(logits, labels)
    return -np.take_along_axis(log_softmax(logits), labels[:, None], axis=1)[:, 0]


def true_class_confidence(logits, labels):
    """Softmax probability p_y of each example's label."""
    return np.exp(-per_example_loss(logits, labels))


def logit_scaled_confidence(logits, labels):
    """φ = log(p_y / (1 − p_y)) = z_y − logsumexp_{j≠y} z_j, stable for p_y near 0 or 1."""
    logits, labels = _logits_labels(logits, labels)
    rows = np.arange(labels.size)
    others = logits.copy()
    others[rows, labels] = -np.inf
    return logits[rows, labels] - special.logsumexp(others, axis=1)


def threshold_attack(member_scores, nonmember_scores, *, name="threshold", delta=0.0,
                     confidence=0.95, fprs=DEFAULT_FPRS, seed=0):
    """Evaluates "member iff score ≥ t" over all t; returns an :class:`AttackResult`.

    ``seed`` seeds the random halves of the split ε bound.

    >>> result = threshold_attack([0.9, 0.8, 0.4], [0.7, 0.3, 0.2])
    >>> round(result.auc, 4), round(result.advantage, 4), result.tpr_at[0.01]
    (0.8889, 0.6667, 0.666...)
    """
    roc = metrics.roc_curve(member_scores, nonmember_scores)
    return AttackResult(
        name=name, roc=roc, auc=metrics.roc_auc(roc),
        advantage=metrics.attacker_advantage(roc),
        tpr_at={float(f): metrics.tpr_at_fpr(roc, f) for f in fprs},
        epsilon_lb=metrics.epsilon_lower_bound(roc, delta=delta, confidence=confidence),
        epsilon_lb_split=metrics.split_epsilon_lower_bound(
            member_scores, nonmember_scores, delta=delta, confidence=confidence, seed=seed))


def loss_attack(member_logits, member_labels, nonmember_logits, nonmember_labels, **kwargs):
    """Threshold attack on −loss (members have lower loss); kwargs as threshold_attack."""
    kwargs.setdefault("name", "loss")
    return threshold_attack(-per_example_loss(member_logits, member_labels),
                            -per_example_loss(nonmember_logits, nonmember_labels), **kwargs)


def max_confidence_score(logits):
    """Label-free confidence: logit-scaled max_j p_j (monotone in max_j p_j, no saturation).

    >>> np.round(max_confidence_score([[0.0, 2.0, 0.0]]), 4)
    array([1.3069])
    """
    logits = np.asarray(logits, dtype=np.float64)
    return logit_scaled_confidence(logits, np.argmax(logits, axis=1))


def confidence_attack(member_logits, member_labels, nonmember_logits, nonmember_labels, *,
                      use_label=False, **kwargs):
    """Threshold attack on the model's confidence; kwargs as threshold_attack.

    Default: the top softmax probability max_j p_j, which needs no label (Salem et al.
    2019); labels may be None. ``use_label=True`` scores p_y instead, which ranks
    exactly like the loss attack (p_y = e^{−loss}).
    """
    kwargs.setdefault("name", "confidence")
    if use_label:
        return threshold_attack(logit_scaled_confidence(member_logits, member_labels),
                                logit_scaled_confidence(nonmember_logits, nonmember_labels),
                                **kwargs)
    return threshold_attack(max_confidence_score(member_logits),
                            max_confidence_score(nonmember_logits), **kwargs)


def balanced_keep(num_shadow, num_examples, seed=0):
    """Boolean [num_shadow, num_examples]: which examples each shadow model trains on.

    Each example is "in" for exactly ``num_shadow // 2`` shadow models (so online
    LiRA has in- and out-models for every example once num_shadow ≥ 2).

    >>> balanced_keep(4, 3, seed=0).sum(axis=0).tolist()
    [2, 2, 2]
    """
    rng = np.random.default_rng(seed)
    order = np.argsort(rng.random((num_shadow, num_examples)), axis=0)
    return order < num_shadow // 2


def shadow_scores(train_and_score, num_examples, *, num_shadow, seed=0):
    """Trains ``num_shadow`` shadow models on balanced halves of a pool of examples.

    Args:
        train_and_score: ``f(keep, seed) -> φ``: trains a model on the pool
            examples where the bool mask ``keep`` [num_examples] is True and returns
            the logit-scaled confidence (:func:`logit_scaled_confidence`) of ALL
            ``num_examples`` pool examples under it.
        num_examples: pool size.
        num_shadow: number of shadow models (≥ 2; LiRA's paper uses 16 to 256).
        seed: seeds the split and, as ``seed + 1 + i``, shadow model i.

    Returns:
        (scores [num_shadow, num_examples], keep [num_shadow, num_examples]).
    """
    if num_shadow < 2:
        raise ValueError(f"num_shadow must be at least 2, got {num_shadow!r}.")
    keep = balanced_keep(num_shadow, num_examples, seed)
    scores = np.stack([np.asarray(train_and_score(keep[i], seed + 1 + i), dtype=np.float64)
                       for i in range(num_shadow)])
    if scores.shape != keep.shape:
        raise ValueError(f"train_and_score must return one score per pool example "
                         f"({num_examples}), got shape {scores.shape[1:]}.")
    return scores, keep


def _gaussian_fit(scores, mask, fix_variance):
    """Per-example mean and std of scores[mask] (pooled within-example std if fixed)."""
    count = mask.sum(axis=0)
    total = np.where(mask, scores, 0.0).sum(axis=0)
    mean = np.divide(total, count, out=np.full(count.shape, np.nan), where=count > 0)
    sq = np.where(mask, (scores - np.nan_to_num(mean)) ** 2, 0.0).sum(axis=0)
    dof = np.maximum(count - 1, 0)
    pooled = np.sqrt(sq.sum() / dof.sum()) if dof.sum() > 0 else 1.0
    if fix_variance:
        std = np.full(count.shape, pooled)
    else:
        std = np.sqrt(np.divide(sq, dof, out=np.full(count.shape, pooled ** 2),
                                where=dof > 0))
    return mean, np.maximum(std, 1e-6)


def lira_scores(target_scores, shadow, keep, *, online=True, fix_variance=True):
    """LiRA membership scores (higher = member) of the target model's φ (module doc).

    Args:
        target_scores: φ of each pool example under the target model, [N].
        shadow, keep: as returned by :func:`shadow_scores`, [S, N].
        online: use in- and out-models (True) or out-models only (False). Examples
            with no in-model (or, online, no out-model) fall back to offline.
        fix_variance: one pooled σ for all examples (recommended below ~64 shadows).

    >>> keep = balanced_keep(8, 2, seed=0)
    >>> shadow = np.where(keep, 2.0, 0.0) + np.linspace(-0.1, 0.1, 8)[:, None]
    >>> scores = lira_scores([2.0, 0.0], shadow, keep)   # φ = in-mean, φ = out-mean
    >>> bool(scores[0] > 0 > scores[1])
    True
    """
    target = np.asarray(target_scores, dtype=np.float64).reshape(-1)
    shadow = np.asarray(shadow, dtype=np.float64)
    keep = np.asarray(keep, dtype=bool)
    if shadow.shape != keep.shape or shadow.ndim != 2 or shadow.shape[1] != target.size:
        raise ValueError(f"need target [N], shadow and keep [S, N]; got {target.shape}, "
                         f"{shadow.shape}, {keep.shape}.")
    mean_out, std_out = _gaussian_fit(shadow, ~keep, fix_variance)
    mean_out = np.where(np.isnan(mean_out), np.nanmean(mean_out) if np.any(~np.isnan(
        mean_out)) else 0.0, mean_out)
    offline = (target - mean_out) / std_out
    if not online:
        return offline
    mean_in, std_in = _gaussian_fit(shadow, keep, fix_variance)

    def log_normal(x, mean, std):
        return -0.5 * ((x - mean) / std) ** 2 - np.log(std)

    has_in = ~np.isnan(mean_in) & (np.sum(~keep, axis=0) > 0)
    ratio = log_normal(target, np.nan_to_num(mean_in), std_in) - log_normal(
        target, mean_out, std_out)
    return np.where(has_in, ratio, offline)


def lira_attack(target_scores, shadow, keep, is_member, *, online=True, fix_variance=True,
                **kwargs):
    """LiRA as an :class:`AttackResult`; ``is_member`` [N] says which pool examples the
    target model trained on. Other kwargs as :func:`threshold_attack`."""
    is_member = np.asarray(is_member, dtype=bool).reshape(-1)
    scores = lira_scores(target_scores, shadow, keep, online=online,
                         fix_variance=fix_variance)
    kwargs.setdefault("name", f"lira_{'online' if online else 'offline'}")
    return threshold_attack(scores[is_member], scores[~is_member], **kwargs)
