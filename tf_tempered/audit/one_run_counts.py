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
"""One-run audit from counts: the ε lower bound of m canaries, k guesses, v right (NumPy/SciPy).

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

All 100 guesses right, δ = 0: p(ε) = q^100, so ε = logit(0.05^(1/100)):

>>> round(epsilon_one_run_from_counts(1000, 100, 100, delta=0.0), 4)
3.493
>>> round(float(special.logit(0.05 ** (1 / 100))), 4)
3.493
"""

import dataclasses
import functools
import math
import numbers

import numpy as np
from scipy import optimize, special, stats

__all__ = ["DEFAULT_DELTA", "OneRunBound", "epsilon_one_run_fdp_from_counts",
           "epsilon_one_run_from_counts", "one_run_p_value"]

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
