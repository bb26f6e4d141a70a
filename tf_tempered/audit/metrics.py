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
"""Membership-inference metrics and the ε lower bound they imply (NumPy/SciPy only).

Convention: a higher score means "more likely a member", and the attack at
threshold ``t`` says "member" when ``score ≥ t``. Over all thresholds this traces
the ROC curve (FPR, TPR), from (0, 0) to (1, 1).

* AUC = P[member score > non-member score] + ½·P[tie] (trapezoidal ROC area);
* attacker advantage = max_t (TPR − FPR);
* TPR at FPR α = the largest TPR among thresholds with FPR ≤ α.

If training is (ε, δ)-DP then at every threshold (Kairouz et al. 2015)::

    TPR ≤ e^ε·FPR + δ        and        1 − FPR ≤ e^ε·(1 − TPR) + δ,

so an attack's counts give the empirical lower bound (Jagielski et al. 2020,
Nasr et al. 2021)::

    ε_lb = max_t max( log((TPR_lo − δ) / FPR_hi),  log((1 − FPR_hi − δ) / (1 − TPR_lo)) )

with Clopper–Pearson bounds ``TPR_lo`` and ``FPR_hi`` from the counts.

>>> roc = roc_curve([0.9, 0.8, 0.4], [0.7, 0.3, 0.2])
>>> round(roc_auc(roc), 4), round(attacker_advantage(roc), 4)
(0.8889, 0.6667)
>>> exposure(rank=1, num_candidates=8)
3.0
"""

import dataclasses
import math
import numbers

import numpy as np
from scipy import stats

__all__ = ["RocCurve", "roc_curve", "roc_auc", "attacker_advantage", "tpr_at_fpr",
           "clopper_pearson", "EpsilonLowerBound", "epsilon_lower_bound",
           "split_epsilon_lower_bound", "exposure"]


@dataclasses.dataclass(frozen=True)
class RocCurve:
    """ROC of a threshold attack: one point per threshold, FPR and TPR non-decreasing.

    ``thresholds[0]`` is ``+inf`` (nothing called a member); the counts are the
    members (``true_positives``) and non-members (``false_positives``) with
    ``score ≥ threshold``.
    """

    fpr: np.ndarray
    tpr: np.ndarray
    thresholds: np.ndarray
    true_positives: np.ndarray
    false_positives: np.ndarray
    num_members: int
    num_nonmembers: int

    @property
    def auc(self):
        """Area under the curve; see :func:`roc_auc`."""
        return roc_auc(self)

    @property
    def advantage(self):
        """max(TPR − FPR); see :func:`attacker_advantage`."""
        return attacker_advantage(self)


def _scores(values, name):
    array = np.asarray(values, dtype=np.float64).reshape(-1)
    if array.size == 0:
        raise ValueError(f"{name} is empty; an attack needs at least one score of each kind.")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} has {int(np.sum(~np.isfinite(array)))} non-finite "
                         f"values (NaN or inf); compute scores from logits (e.g. "
                         f"attacks.per_example_loss) or clip them first.")
    return array


def roc_curve(member_scores, nonmember_scores):
    """The ROC of "member iff score ≥ t" over every distinct score t (higher = member).

    >>> roc = roc_curve([3, 2, 2], [2, 1])
    >>> roc.thresholds.tolist(), roc.tpr.tolist(), roc.fpr.tolist()
    ([inf, 3.0, 2.0, 1.0], [0.0, 0.333..., 1.0, 1.0], [0.0, 0.0, 0.5, 1.0])
    """
    members = np.sort(_scores(member_scores, "member_scores"))
    nonmembers = np.sort(_scores(nonmember_scores, "nonmember_scores"))
    thresholds = np.unique(np.concatenate([members, nonmembers]))[::-1]
    tp = members.size - np.searchsorted(members, thresholds, side="left")
    fp = nonmembers.size - np.searchsorted(nonmembers, thresholds, side="left")
    thresholds = np.concatenate([[np.inf], thresholds])
    tp = np.concatenate([[0], tp]).astype(np.int64)
    fp = np.concatenate([[0], fp]).astype(np.int64)
    return RocCurve(fpr=fp / nonmembers.size, tpr=tp / members.size, thresholds=thresholds,
                    true_positives=tp, false_positives=fp, num_members=members.size,
                    num_nonmembers=nonmembers.size)


def roc_auc(roc):
    """Trapezoidal area under the ROC = P[s_member > s_nonmember] + ½·P[tie], from the
    integer counts with one division at the end: a perfect attack gives exactly 1.0 (the
    sum of float rate steps gave 0.9999999999999999 for some counts of canaries).

    >>> roc_auc(roc_curve([1, 0], [1, 0]))
    0.5
    >>> roc_auc(roc_curve(np.arange(10.0, 13.0), np.arange(7.0))) == 1.0  # 3 above 7
    True
    """
    fp, tp = roc.false_positives, roc.true_positives
    area_twice = int(np.sum(np.diff(fp) * (tp[1:] + tp[:-1])))
    return area_twice / (2 * roc.num_members * roc.num_nonmembers)


def attacker_advantage(roc):
    """max over thresholds of TPR − FPR (0 for a useless attack, 1 for a perfect one).

    >>> attacker_advantage(roc_curve([5, 4, 1], [3, 2, 0]))
    0.666...
    """
    return float(np.max(roc.tpr - roc.fpr))


def tpr_at_fpr(roc, fpr):
    """The largest TPR among thresholds with FPR ≤ ``fpr`` (0.001 = 0.1%).

    With n non-members, FPR ≤ fpr allows floor(fpr·n) false positives.

    >>> roc = roc_curve([10, 9, 8, 0.5], [7, 0, 0, 0])
    >>> tpr_at_fpr(roc, 0.0), tpr_at_fpr(roc, 0.25)
    (0.75, 1.0)
    """
    if not 0 <= fpr <= 1:
        raise ValueError(f"fpr must be in [0, 1], got {fpr!r}; e.g. 0.001 for 0.1%.")
    return float(np.max(roc.tpr[roc.fpr <= fpr + 1e-12]))


def clopper_pearson(successes, trials, confidence=0.95):
    """Two-sided Clopper–Pearson interval (lower, upper) for a binomial proportion.

    lower = Beta⁻¹(α/2; k, n − k + 1) (0 when k = 0) and upper = Beta⁻¹(1 − α/2;
    k + 1, n − k) (1 when k = n), with α = 1 − confidence. Vectorized over k.

    >>> lower, upper = clopper_pearson(0, 10)
    >>> float(lower), round(float(upper), 4)
    (0.0, 0.3085)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}; e.g. 0.95.")
    k = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if np.any(n < 1) or np.any(k < 0) or np.any(k > n):
        raise ValueError(f"need 0 ≤ successes ≤ trials and trials ≥ 1, got successes="
                         f"{successes!r}, trials={trials!r}.")
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lower, upper


@dataclasses.dataclass(frozen=True)
class EpsilonLowerBound:
    """The ε lower bound of one attack and where it was attained.

    ``epsilon`` is the bound with Clopper–Pearson counts at ``confidence`` (≥ 0);
    ``point_estimate`` is the same maximum with the raw rates (no confidence; only
    thresholds with a non-zero denominator count, so it is finite but optimistic);
    ``form`` is ``"tpr/fpr"`` or ``"tnr/fnr"``, the inequality that attained it.
    """

    epsilon: float
    point_estimate: float
    threshold: float
    form: str
    tpr_lower: float
    fpr_upper: float
    confidence: float
    delta: float


def _log_ratio(numerator, denominator):
    with np.errstate(invalid="ignore", divide="ignore"):
        ok = (numerator > 0) & (denominator > 0)
        return np.where(ok, np.log(np.where(ok, numerator, 1.0) / np.where(ok, denominator, 1.0)),
                        -np.inf)


def epsilon_lower_bound(roc, *, delta=0.0, confidence=0.95):
    """Empirical ε lower bound of an attack on an (ε, δ)-DP training run (see module doc).

    Each count gets a two-sided Clopper–Pearson interval at ``confidence``; only
    TPR's lower and FPR's upper ends are used, so at a FIXED threshold the bound
    holds with probability ≥ ``confidence`` when the trials are independent (one
    training run per trial). Two caveats: the maximum over thresholds picked on the
    same scores is slightly optimistic (pick the threshold on held-out scores for a
    rigorous bound); and the examples of ONE run are only approximately
    independent trials: assign membership at random over a common pool (as the
    one-run audit of Steinke, Nasr and Jagielski 2023 does; its rigorous bound is
    somewhat lower), never by a train-vs-test split. 0 means "nothing shown".

    >>> roc = roc_curve([1] * 95 + [0] * 5, [1] * 5 + [0] * 95)   # TPR .95, FPR .05
    >>> bound = epsilon_lower_bound(roc, delta=0.0)
    >>> round(bound.point_estimate, 3), round(bound.epsilon, 2)   # log(.95/.05), CP bound
    (2.944, 2.06)
    """
    if not 0 <= delta < 1:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}; e.g. 1e-5.")
    tpr_lo, _ = clopper_pearson(roc.true_positives, roc.num_members, confidence)
    _, fpr_hi = clopper_pearson(roc.false_positives, roc.num_nonmembers, confidence)
    bounds = np.stack([_log_ratio(tpr_lo - delta, fpr_hi),
                       _log_ratio(1.0 - fpr_hi - delta, 1.0 - tpr_lo)])
    points = np.stack([_log_ratio(roc.tpr - delta, roc.fpr),
                       _log_ratio(1.0 - roc.fpr - delta, 1.0 - roc.tpr)])
    form, index = np.unravel_index(int(np.argmax(bounds)), bounds.shape)
    best = float(bounds[form, index])
    return EpsilonLowerBound(
        epsilon=max(0.0, best), point_estimate=max(0.0, float(np.max(points))),
        threshold=float(roc.thresholds[index]), form=_FORMS[form],
        tpr_lower=float(tpr_lo[index]), fpr_upper=float(fpr_hi[index]),
        confidence=float(confidence), delta=float(delta))


_FORMS = ("tpr/fpr", "tnr/fnr")


def split_epsilon_lower_bound(member_scores, nonmember_scores, *, delta=0.0, confidence=0.95,
                              seed=0):
    """ε lower bound with the threshold chosen on held-out scores (no selection bias).

    Splits members and non-members at random into halves, picks the threshold and
    form with the largest :func:`epsilon_lower_bound` on the first halves, and
    returns the Clopper–Pearson bound at that threshold on the second halves. Half
    the data, so usually lower than :func:`epsilon_lower_bound`, but valid at
    ``confidence`` for independent trials.

    >>> rng = np.random.default_rng(0)
    >>> members, nonmembers = rng.normal(2, 1, 2000), rng.normal(0, 1, 2000)
    >>> bound = split_epsilon_lower_bound(members, nonmembers)
    >>> 0 < bound.epsilon < epsilon_lower_bound(roc_curve(members, nonmembers)).epsilon
    True
    """
    members = _scores(member_scores, "member_scores")
    nonmembers = _scores(nonmember_scores, "nonmember_scores")
    if members.size < 2 or nonmembers.size < 2:
        raise ValueError("split_epsilon_lower_bound needs at least 2 scores of each kind.")
    rng = np.random.default_rng(seed)
    members, nonmembers = rng.permutation(members), rng.permutation(nonmembers)
    half_m, half_n = members.size // 2, nonmembers.size // 2
    chosen = epsilon_lower_bound(roc_curve(members[:half_m], nonmembers[:half_n]),
                                 delta=delta, confidence=confidence)
    test_m, test_n = members[half_m:], nonmembers[half_n:]
    tp = int(np.sum(test_m >= chosen.threshold))
    fp = int(np.sum(test_n >= chosen.threshold))
    tpr_lo, _ = clopper_pearson(tp, test_m.size, confidence)
    _, fpr_hi = clopper_pearson(fp, test_n.size, confidence)
    tpr, fpr = tp / test_m.size, fp / test_n.size
    if chosen.form == _FORMS[0]:
        bound = _log_ratio(tpr_lo - delta, fpr_hi)
        point = _log_ratio(np.float64(tpr - delta), np.float64(fpr))
    else:
        bound = _log_ratio(1.0 - fpr_hi - delta, 1.0 - tpr_lo)
        point = _log_ratio(np.float64(1.0 - fpr - delta), np.float64(1.0 - tpr))
    return EpsilonLowerBound(
        epsilon=max(0.0, float(bound)), point_estimate=max(0.0, float(point)),
        threshold=chosen.threshold, form=chosen.form, tpr_lower=float(tpr_lo),
        fpr_upper=float(fpr_hi), confidence=float(confidence), delta=float(delta))


def exposure(rank, num_candidates):
    """Exposure of a secret ranked ``rank`` (1 = most likely) among ``num_candidates``.

    exposure = log2(num_candidates) − log2(rank) (Carlini et al. 2019, "The Secret
    Sharer"), from 0 (ranked last) to log2(num_candidates) (ranked first).
    Vectorized over ``rank``.

    >>> exposure(rank=2, num_candidates=1024), exposure(rank=[1, 10], num_candidates=10)
    (9.0, array([3.32..., 0.  ]))
    """
    if (isinstance(num_candidates, bool) or not isinstance(num_candidates, numbers.Integral)
            or num_candidates < 1):
        raise ValueError(f"num_candidates must be a positive integer, got {num_candidates!r}.")
    ranks = np.asarray(rank)
    if ranks.size and (np.any(ranks < 1) or np.any(ranks > num_candidates)
                       or np.any(ranks != np.floor(ranks))):
        raise ValueError(f"rank must be integers in [1, num_candidates={num_candidates}], "
                         f"got {rank!r}.")
    values = math.log2(num_candidates) - np.log2(ranks.astype(np.float64))
    return float(values) if values.ndim == 0 else values
