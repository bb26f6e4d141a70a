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

**Steinke et al.** If training is (ε, δ)-DP then, with q = e^ε / (1 + e^ε) and
B ~ Binomial(k, q)::

    P[V ≥ v] ≤ p(ε) = β + 2·m·δ·α,   β = P[B ≥ v],   α = max_{1≤i≤v} P[v − i ≤ B < v] / i

(δ = 0: p = β). The claim is rejected at significance τ when p(ε) ≤ τ, and the
bound is the largest rejected ε (0 when none is). With δ = 0 it has a closed form:
β = I_q(v, k − v + 1) (regularized incomplete beta), so ε = logit(Beta⁻¹(τ; v, k − v + 1)).

**Mahloujifar, Melis & Chaudhuri** ("Auditing f-Differential Privacy in One Run",
2024, arXiv:2410.22235). Usually tighter: the claim tested is that training is μ-GDP
(Gaussian trade-off curve) with the μ whose exact (ε, δ) curve passes through
(ε, δ) (the analytic Gaussian mechanism of Balle & Wang 2018), so f̄⁻¹(x) =
Φ(Φ⁻¹(x) − μ) is the least FPR that reaches TPR x. Their recursion (the
``audit_rh_with_cap`` procedure; r_i capped at 1 as in JAX Privacy)::

    r_v = τ·v/m,   h_v = τ·(k − v)/m,
    for i = v − 1, …, 0:   h_i = max(h_{i+1}, f̄⁻¹(r_{i+1})),
                           r_i = min(1, r_{i+1} + i/(k − i)·(h_i − h_{i+1})),

rejects when r_0 + h_0 > k/m. So this bound assumes the Gaussian shape of the
privacy curve (DP-SGD's noise is Gaussian), where Steinke et al. assume only
(ε, δ)-DP: it tells how much privacy a Gaussian curve through the data would have.

From scores, k is chosen over the thresholds of the ROC's convex hull (its
vertices, the no-guess one included), each tested at τ / (number of vertices)
(Bonferroni), as JAX Privacy's ``CanaryScoreAuditor`` does by default (same
results, to the 1e-6 tolerance of its root finding). The set of hull vertices
itself depends on the scores, so for a strictly valid bound fix ``threshold=`` in
advance (e.g. on held-out canaries): it is then tested at τ. Scores: higher =
member, as in :mod:`.metrics`.

All 100 guesses right, δ = 0: p(ε) = q^100, so ε = logit(0.05^(1/100)):

>>> round(epsilon_one_run_from_counts(1000, 100, 100, delta=0.0), 4)
3.493
>>> round(float(special.logit(0.05 ** (1 / 100))), 4)
3.493
>>> in_scores, out_scores = np.arange(100) + 50.0, np.arange(100.0)   # top 50 all in
>>> bound = epsilon_one_run(in_scores, out_scores, delta=1e-5)
>>> round(bound.epsilon, 3), bound.threshold, bound.num_guesses, bound.num_correct
(2.379, 100.0, 50, 50)
>>> round(epsilon_one_run_fdp(in_scores, out_scores, delta=1e-5).epsilon, 3)
4.01
"""

import dataclasses
import functools
import math
import numbers

import numpy as np
from scipy import optimize, special, stats

from tf_tempered.audit import metrics

__all__ = ["OneRunBound", "one_run_p_value", "epsilon_one_run_from_counts",
           "epsilon_one_run_fdp_from_counts", "epsilon_one_run", "epsilon_one_run_fdp",
           "OneRunAudit", "one_run_audit"]

# The δ of the accounted ε elsewhere in tf_tempered (privacy.accounting.DEFAULT_DELTA),
# repeated here so this module stays NumPy/SciPy only.
DEFAULT_DELTA = 1e-5
_XTOL = 1e-10   # absolute tolerance on ε of the root finding


@dataclasses.dataclass(frozen=True)
class OneRunBound:
    """A one-run ε lower bound and the guesses that attained it.

    ``threshold`` is the score at and above which the auditor guessed "in" (``inf``
    when no threshold rejected anything); ``num_thresholds`` is the Bonferroni
    factor: each threshold was tested at ``significance / num_thresholds``.
    ``method`` is ``"steinke"`` or ``"fdp_gaussian"``.
    """

    epsilon: float
    threshold: float
    num_canaries: int
    num_guesses: int
    num_correct: int
    significance: float
    num_thresholds: int
    delta: float
    method: str


def _count(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}.")
    return int(value)


def _check_counts(num_canaries, num_guesses, num_correct):
    m = _count(num_canaries, "num_canaries")
    k = _count(num_guesses, "num_guesses")
    v = _count(num_correct, "num_correct")
    if not v <= k <= m or m == 0:
        raise ValueError(f"need 0 ≤ num_correct ≤ num_guesses ≤ num_canaries and "
                         f"num_canaries ≥ 1, got num_canaries={m}, num_guesses={k}, "
                         f"num_correct={v}; guesses are a subset of the canaries.")
    return m, k, v


def _check_significance(significance):
    if not 0 < significance < 1:
        raise ValueError(f"significance must be in (0, 1), got {significance!r}; e.g. "
                         f"0.05 for a bound that holds with 95% confidence.")
    return float(significance)


def _check_delta(delta, *, allow_zero):
    low_ok = delta >= 0 if allow_zero else delta > 0
    if not (low_ok and delta < 1):
        interval = "[0, 1)" if allow_zero else "(0, 1) (the f-DP bound needs δ > 0)"
        raise ValueError(f"delta must be in {interval}, got {delta!r}; e.g. 1e-5, the δ "
                         f"of the accounted ε.")
    return float(delta)


def _p_value(m, k, v, epsilon, delta):
    if v == 0:
        return 1.0
    q = special.expit(epsilon)
    beta = float(stats.binom.sf(v - 1, k, q))
    if delta == 0:
        return beta
    # below[i - 1] = P[v − i ≤ B ≤ v − 1], i = 1..v
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), k, q))
    alpha = float(np.max(below / np.arange(1, v + 1)))
    return min(1.0, beta + 2.0 * m * delta * alpha)


def one_run_p_value(num_canaries, num_guesses, num_correct, epsilon, delta=0.0):
    """p-value of "training is (ε, δ)-DP" given v correct of k guesses among m canaries.

    p = min(1, β + 2·m·δ·α) with β = P[B ≥ v], α = max_{1≤i≤v} P[v − i ≤ B < v] / i
    and B ~ Binomial(k, e^ε / (1 + e^ε)) (Steinke et al. 2023; see the module doc).

    >>> round(one_run_p_value(1000, 10, 10, epsilon=1.0), 4)    # q^10, q = e/(1 + e)
    0.0436
    >>> round(one_run_p_value(1000, 10, 10, epsilon=1.0, delta=1e-5), 4)
    0.0482
    """
    m, k, v = _check_counts(num_canaries, num_guesses, num_correct)
    if not 0 <= epsilon < math.inf:
        raise ValueError(f"epsilon must be finite and ≥ 0, got {epsilon!r}.")
    return _p_value(m, k, v, float(epsilon), _check_delta(delta, allow_zero=True))


def _largest_rejected(margin, floor):
    """Largest ε ≥ floor with margin(ε) > 0, margin decreasing in ε; floor if none.

    Doubles an upper end until margin ≤ 0, then Brent's method between the ends.
    """
    if margin(floor) <= 0:
        return floor
    low, high = floor, max(1.0, 2.0 * floor)
    while margin(high) > 0:
        low, high = high, 2.0 * high
        if high > 1e6:
            raise RuntimeError("the one-run bound did not converge below ε = 1e6.")
    return float(optimize.brentq(margin, low, high, xtol=_XTOL))


def _steinke_epsilon(m, k, v, significance, delta, floor=0.0):
    # p(ε, δ) ≥ p(ε, 0): if δ = 0 cannot reject at the floor, δ > 0 cannot either.
    if k == 0 or _p_value(m, k, v, floor, 0.0) > significance:
        return floor
    return _largest_rejected(lambda eps: significance - _p_value(m, k, v, eps, delta), floor)


def epsilon_one_run_from_counts(num_canaries, num_guesses, num_correct, *, significance=0.05,
                                delta=DEFAULT_DELTA):
    """Steinke et al.'s ε lower bound from counts: the largest ε with p-value ≤ significance.

    The guesses must be chosen without looking at which canaries are in (any
    choice is fine, including two-sided ones: k = k₊ + k₋ guesses, v right).

    >>> round(epsilon_one_run_from_counts(1000, 100, 90, significance=0.05, delta=0.0), 4)
    1.6308
    >>> round(epsilon_one_run_from_counts(1000, 100, 90, significance=0.05, delta=1e-5), 4)
    1.6261
    """
    m, k, v = _check_counts(num_canaries, num_guesses, num_correct)
    return _steinke_epsilon(m, k, v, _check_significance(significance),
                            _check_delta(delta, allow_zero=True))


def _log_gaussian_delta(mu, epsilon):
    """log δ(ε) of μ-GDP: log(Φ(−ε/μ + μ/2) − e^ε·Φ(−ε/μ − μ/2)) (Dong et al. 2019, C. 2.13)."""
    first = special.log_ndtr(-epsilon / mu + mu / 2)
    second = epsilon + special.log_ndtr(-epsilon / mu - mu / 2)
    return first + math.log1p(-math.exp(second - first)) if second < first else -math.inf


@functools.lru_cache(maxsize=4096)
def _gaussian_mu(epsilon, delta):
    """The μ of the Gaussian mechanism (sensitivity 1, σ = 1/μ) that is exactly (ε, δ)-DP."""
    log_delta = math.log(delta)
    low, high = 0.5, 2.0
    while _log_gaussian_delta(low, epsilon) > log_delta:
        low /= 2.0
    while _log_gaussian_delta(high, epsilon) < log_delta:
        high *= 2.0
    return float(optimize.brentq(lambda mu: _log_gaussian_delta(mu, epsilon) - log_delta,
                                 low, high, xtol=1e-14, rtol=1e-14))


def _fdp_margin(m, k, v, significance, mu):
    """r_0 + h_0 − k/m of the recursion in the module doc (> 0: μ-GDP is rejected)."""
    r, h = significance * v / m, significance * (k - v) / m
    for i in range(v - 1, -1, -1):
        h_next = max(h, float(special.ndtr(special.ndtri(r) - mu)))
        if h_next == h:   # a fixed point: neither r nor h changes any more
            break
        r, h = min(1.0, r + i / (k - i) * (h_next - h)), h_next
    return r + h - k / m


def _fdp_epsilon(m, k, v, significance, delta, floor=0.0):
    if k == 0 or v == 0:
        return floor
    return _largest_rejected(
        lambda eps: _fdp_margin(m, k, v, significance, _gaussian_mu(eps, delta)), floor)


def epsilon_one_run_fdp_from_counts(num_canaries, num_guesses, num_correct, *,
                                    significance=0.05, delta=DEFAULT_DELTA):
    """Mahloujifar et al.'s ε lower bound (Gaussian f-DP) from counts; see the module doc.

    The largest ε whose Gaussian curve μ(ε, δ) the recursion rejects at
    ``significance``; usually well above :func:`epsilon_one_run_from_counts`.

    >>> round(epsilon_one_run_fdp_from_counts(1000, 100, 90, delta=1e-5), 3)
    2.456
    """
    m, k, v = _check_counts(num_canaries, num_guesses, num_correct)
    return _fdp_epsilon(m, k, v, _check_significance(significance),
                        _check_delta(delta, allow_zero=False))


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
