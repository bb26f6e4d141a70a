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
"""One-run privacy audit: ε lower bounds from a single training run (NumPy/SciPy only).

Setup (Steinke, Nasr & Jagielski, "Privacy Auditing with One (1) Training Run",
NeurIPS 2023): m canaries, each included in training independently with
probability ½. After the one run the auditor scores every canary (higher = "more
likely in"), guesses "in" for the k canaries with score ≥ t and abstains on the
rest (one-sided guesses, k₋ = 0, as in JAX Privacy); v of the k guesses are right.

The estimators from counts (Steinke et al.; Mahloujifar et al.'s f-DP one) are in
:mod:`.one_run_counts`.

From scores, k is chosen over the thresholds of the ROC's convex hull (its
vertices, the no-guess one included), each tested at τ / (number of vertices)
(Bonferroni), as JAX Privacy's ``CanaryScoreAuditor`` does by default (same
results, to the 1e-6 tolerance of its root finding). The set of hull vertices
itself depends on the scores, so for a strictly valid bound fix ``threshold=`` in
advance (e.g. on held-out canaries): it is then tested at τ. Scores: higher =
member, as in :mod:`.metrics`.

>>> in_scores, out_scores = np.arange(100) + 50.0, np.arange(100.0)   # top 50 all in
>>> bound = epsilon_one_run(in_scores, out_scores, delta=1e-5)
>>> round(bound.epsilon, 3), bound.threshold, bound.num_guesses, bound.num_correct
(2.379, 100.0, 50, 50)
>>> round(epsilon_one_run_fdp(in_scores, out_scores, delta=1e-5).epsilon, 3)
4.01
"""

import dataclasses
import math
import numbers

import numpy as np
from scipy import special, stats

from tf_tempered.audit import metrics
from tf_tempered.audit.one_run_counts import (DEFAULT_DELTA, OneRunBound, _check_delta,
                                              _check_significance, _fdp_epsilon,
                                              _steinke_epsilon)

__all__ = ["OneRunAudit", "epsilon_one_run", "epsilon_one_run_fdp", "one_run_audit"]


def _upper_hull(x, y):
    """Indices of the vertices of the upper convex hull of points sorted by (x, y).

    Andrew's monotone chain on exact integers; collinear points are dropped.
    """
    hull = []
    for index in range(len(x)):
        while len(hull) >= 2:
            o, a = hull[-2], hull[-1]
            cross = (x[a] - x[o]) * (y[index] - y[o]) - (y[a] - y[o]) * (x[index] - x[o])
            if cross < 0:   # a right turn: a stays on the hull
                break
            hull.pop()
        hull.append(index)
    return np.asarray(hull, dtype=np.int64)


def _precision_lower_bound(correct, guesses, significance):
    """One-sided Clopper–Pearson lower bound on v/k (0 where v = 0)."""
    with np.errstate(invalid="ignore"):
        bound = stats.beta.ppf(significance, correct, guesses - correct + 1)
    return np.where(correct > 0, bound, 0.0)


def _explicit(roc, threshold, significance, delta, bound_fn, method):
    if not isinstance(threshold, numbers.Real) or math.isnan(threshold):
        raise ValueError(f"threshold must be a number (guess \"in\" for scores ≥ it), or "
                         f"None to search the ROC hull; got {threshold!r}.")
    # roc.thresholds descend from +inf: the last one ≥ threshold has the counts at it.
    index = int(np.sum(roc.thresholds >= threshold)) - 1
    v, fp = int(roc.true_positives[index]), int(roc.false_positives[index])
    m = roc.num_members + roc.num_nonmembers
    return OneRunBound(epsilon=bound_fn(m, v + fp, v, significance, delta),
                       threshold=float(threshold), num_canaries=m, num_guesses=v + fp,
                       num_correct=v, significance=significance, num_thresholds=1,
                       delta=delta, method=method)


def _search(roc, significance, delta, bound_fn, method, exhaustive):
    """Best bound over the ROC hull's thresholds, each at significance / (number of them).

    Visits thresholds by decreasing precision lower bound. Unless ``exhaustive``, it
    skips those whose raw precision v/k is at most e^ε/(1 + e^ε) of the best ε so
    far, as JAX Privacy does: exact for Steinke et al.'s bound (then P[B ≥ v] ≥ ½ >
    the level), a heuristic for the f-DP one, which such a threshold can still raise.
    """
    hull = _upper_hull(roc.false_positives.tolist(), roc.true_positives.tolist())
    correct = roc.true_positives[hull]
    guesses = correct + roc.false_positives[hull]
    m = roc.num_members + roc.num_nonmembers
    level = significance / hull.size
    best, best_at = 0.0, None
    for j in np.argsort(-_precision_lower_bound(correct, guesses, level), kind="stable"):
        k, v = int(guesses[j]), int(correct[j])
        if k == 0 or (not exhaustive and v / k <= special.expit(best)):
            continue
        epsilon = bound_fn(m, k, v, level, delta, floor=best)
        if epsilon > best:
            best, best_at = epsilon, j
    k, v = (0, 0) if best_at is None else (int(guesses[best_at]), int(correct[best_at]))
    threshold = math.inf if best_at is None else float(roc.thresholds[hull[best_at]])
    return OneRunBound(epsilon=best, threshold=threshold, num_canaries=m, num_guesses=k,
                       num_correct=v, significance=significance, num_thresholds=int(hull.size),
                       delta=delta, method=method)


def _from_scores(in_scores, out_scores, significance, delta, threshold, fdp, *, roc=None,
                 exhaustive=False):
    significance = _check_significance(significance)
    delta = _check_delta(delta, allow_zero=not fdp)
    if roc is None:
        roc = metrics.roc_curve(metrics._scores(in_scores, "in_scores"),
                                metrics._scores(out_scores, "out_scores"))
    bound_fn, method = (_fdp_epsilon, "fdp_gaussian") if fdp else (_steinke_epsilon, "steinke")
    if threshold is None:
        return _search(roc, significance, delta, bound_fn, method, exhaustive)
    return _explicit(roc, threshold, significance, delta, bound_fn, method)


def epsilon_one_run(in_scores, out_scores, *, significance=0.05, delta=DEFAULT_DELTA,
                    threshold=None):
    """Steinke et al.'s one-run ε lower bound from canary scores (higher = in).

    ``in_scores``/``out_scores``: the attack scores of the canaries that were / were
    not in training (membership drawn independently with probability ½ each).
    With ``threshold=None`` the best threshold of the ROC hull is used, each tested
    at ``significance / num_thresholds`` (JAX Privacy's default, Bonferroni);
    otherwise the auditor guesses "in" for scores ≥ ``threshold``, which must have
    been fixed without these scores. Holds with probability ≥ 1 − significance.

    >>> rng = np.random.default_rng(0)
    >>> bound = epsilon_one_run(rng.normal(3, 1, 500), rng.normal(0, 1, 500), delta=1e-5)
    >>> round(bound.epsilon, 2), bound.num_guesses, bound.num_thresholds
    (3.98, 342, 13)
    """
    return _from_scores(in_scores, out_scores, significance, delta, threshold, fdp=False)


def epsilon_one_run_fdp(in_scores, out_scores, *, significance=0.05, delta=DEFAULT_DELTA,
                        threshold=None, exhaustive=False):
    """Mahloujifar et al.'s one-run ε lower bound (Gaussian f-DP) from canary scores.

    Same guesses and threshold choice as :func:`epsilon_one_run`; the test assumes
    a Gaussian privacy curve (see the module doc), so ``delta`` must be > 0. The
    default search skips thresholds as JAX Privacy's does (equal results), which
    can miss the best hull threshold; ``exhaustive=True`` tries them all: never
    lower, and as valid (the Bonferroni factor already counts every threshold).

    >>> rng = np.random.default_rng(0)
    >>> bound = epsilon_one_run_fdp(rng.normal(3, 1, 500), rng.normal(0, 1, 500))
    >>> round(bound.epsilon, 2), bound.method
    (6.37, 'fdp_gaussian')
    """
    return _from_scores(in_scores, out_scores, significance, delta, threshold, fdp=True,
                        exhaustive=exhaustive)


@dataclasses.dataclass(frozen=True)
class OneRunAudit:
    """Both one-run bounds and the attack's ROC summary on the same canary scores.

    ``tpr_at_fpr`` maps each requested FPR to :func:`.metrics.tpr_at_fpr`; ``auc``
    is :func:`.metrics.roc_auc` (no randomized thresholds, unlike JAX Privacy's).
    """

    one_run: OneRunBound
    one_run_fdp: OneRunBound
    auc: float
    tpr_at_fpr: dict


def one_run_audit(in_scores, out_scores, *, significance=0.05, delta=DEFAULT_DELTA,
                  fprs=(0.001, 0.01)):
    """:func:`epsilon_one_run`, :func:`epsilon_one_run_fdp`, AUC and TPR at low FPR.

    >>> rng = np.random.default_rng(0)
    >>> audit = one_run_audit(rng.normal(3, 1, 500), rng.normal(0, 1, 500))
    >>> round(audit.one_run.epsilon, 2), round(audit.one_run_fdp.epsilon, 2)
    (3.98, 6.37)
    >>> round(audit.auc, 3), audit.tpr_at_fpr
    (0.984, {0.001: 0.684, 0.01: 0.776})
    """
    roc = metrics.roc_curve(metrics._scores(in_scores, "in_scores"),
                            metrics._scores(out_scores, "out_scores"))
    return OneRunAudit(
        one_run=_from_scores(None, None, significance, delta, None, fdp=False, roc=roc),
        one_run_fdp=_from_scores(None, None, significance, delta, None, fdp=True, roc=roc),
        auc=metrics.roc_auc(roc),
        tpr_at_fpr={fpr: metrics.tpr_at_fpr(roc, fpr) for fpr in fprs})
