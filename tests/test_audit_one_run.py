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
"""One-run ε lower bounds: JAX Privacy's reference values, closed forms, monotonicity, validity.

Reference implementation: google-deepmind/jax_privacy, jax_privacy/auditing.py and
tests/auditing_test.py at commit 8967688c26d46f3b74bfdfe61ef1f984b887abab (read, not
copied; Apache-2.0). Its root finding stops at xtol = 1e-6, so values agree to ~1e-6.
"""

import itertools
import math

import dp_accounting
import numpy as np
import pytest
from scipy import optimize, special, stats

from tf_tempered import audit
from tf_tempered.audit import metrics, one_run, one_run_counts

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def _deterministic_normal(mean, n):
    """Scores at the n mid-quantiles (i + ½)/n of N(mean, 1), as in JAX Privacy's tests."""
    return stats.norm.ppf(np.linspace(0, 1, n, endpoint=False) + 1 / (2 * n)) + mean


def _naive_p_value(m, k, v, epsilon, delta):
    """Steinke et al.'s p-value term by term: β + 2mδ·max_i Σ_{j=v−i}^{v−1} pmf(j) / i."""
    q = math.exp(epsilon) / (1 + math.exp(epsilon))
    pmf = [math.comb(k, j) * q ** j * (1 - q) ** (k - j) for j in range(k + 1)]
    beta = sum(pmf[v:])
    alpha = max((sum(pmf[v - i:v]) / i for i in range(1, v + 1)), default=0.0)
    return min(1.0, beta + 2 * m * delta * alpha) if delta else min(1.0, beta)


# ------------------------------------------------- JAX Privacy's reference values

# tests/auditing_test.py, test_epsilon_one_run_close: 10 000 in and 10 000 out canaries
# at the mid-quantiles of N(shift, 1) and N(0, 1), significance 0.05, δ = 1e-6, rtol 1e-5.
# num_thresholds: len(auditor._fn_counts) (the Bonferroni factor) printed by running
# jax_privacy/auditing.py at that commit on the same scores.
@pytest.mark.parametrize("shift, expected, expected_fdp, num_thresholds", [
    (0, 0.0, 0.0, 2),
    (1, 1.13346, 2.164749, 386),
    (2, 2.311945, 4.7218075, 374),
    (4, 4.395568, 9.133752, 140),
])
def test_jax_privacy_reference_values(shift, expected, expected_fdp, num_thresholds):
    in_scores, out_scores = _deterministic_normal(shift, 10_000), _deterministic_normal(0, 10_000)
    bound = audit.epsilon_one_run(in_scores, out_scores, significance=0.05, delta=1e-6)
    bound_fdp = audit.epsilon_one_run_fdp(in_scores, out_scores, significance=0.05, delta=1e-6)
    np.testing.assert_allclose(bound.epsilon, expected, rtol=1e-5, atol=1e-9)
    np.testing.assert_allclose(bound_fdp.epsilon, expected_fdp, rtol=1e-5, atol=1e-9)
    assert bound.num_thresholds == bound_fdp.num_thresholds == num_thresholds
    assert bound.num_canaries == 20_000
    if shift:
        assert bound_fdp.epsilon > bound.epsilon    # the f-DP bound is the tighter here


# Printed by running jax_privacy/auditing.py at that commit: _epsilon_one_run(0, m, k, v,
# significance, delta) and _epsilon_one_run_fdp(0, m, k, v, significance, delta).
COUNT_REFERENCES = [
    # (m, k, v, significance, delta), Steinke et al., f-DP
    ((1000, 100, 90, 0.05, 1e-5), 1.6261436787042223, 2.4564050672094146),
    ((1000, 100, 100, 0.05, 1e-5), 3.465376229385333, 5.5490279999429415),
    ((200, 50, 50, 0.0125, 1e-5), 2.3788604187870153, 4.009648898829367),
    ((10000, 1000, 800, 0.05, 1e-6), 1.2539840913064186, 1.9408310449124129),
    ((100, 20, 15, 0.1, 1e-3), 0.2591049764902583, 0.31606597089021254),
    ((5000, 300, 250, 0.01, 1e-6), 1.2477778789939802, 1.7611692183260808),
]


@pytest.mark.parametrize("counts, expected, expected_fdp", COUNT_REFERENCES)
def test_jax_privacy_count_level_values(counts, expected, expected_fdp):
    m, k, v, significance, delta = counts
    assert audit.epsilon_one_run_from_counts(
        m, k, v, significance=significance, delta=delta) == pytest.approx(expected, abs=2e-6)
    assert audit.epsilon_one_run_fdp_from_counts(
        m, k, v, significance=significance, delta=delta) == pytest.approx(expected_fdp, abs=2e-6)


# Integer scores with many ties: 55 in, 55 out. CanaryScoreAuditor(in, out) at that
# commit: 10 hull thresholds; epsilon_one_run / epsilon_one_run_fdp (Bonferroni) and
# with threshold_strategy=Explicit(9.0).
TIED_IN = np.repeat(np.arange(10.0), np.arange(1, 11)) + 3
TIED_OUT = np.repeat(np.arange(10.0), np.arange(10, 0, -1))


@pytest.mark.parametrize("significance, delta, searched, searched_fdp, at_9, at_9_fdp", [
    (0.05, 1e-5, 1.5163058472961026, 2.4301003858615626, 1.9122926838165095,
     3.629222814820502),
    (0.2, 1e-3, 1.133704515933603, 2.2591323408178585, 2.280698787008589,
     3.699597819191958),
])
def test_jax_privacy_values_with_ties(significance, delta, searched, searched_fdp, at_9,
                                      at_9_fdp):
    kwargs = dict(significance=significance, delta=delta)
    bound = audit.epsilon_one_run(TIED_IN, TIED_OUT, **kwargs)
    assert bound.num_thresholds == 10
    assert bound.epsilon == pytest.approx(searched, abs=2e-6)
    assert audit.epsilon_one_run_fdp(TIED_IN, TIED_OUT, **kwargs).epsilon == pytest.approx(
        searched_fdp, abs=2e-6)
    fixed = audit.epsilon_one_run(TIED_IN, TIED_OUT, threshold=9.0, **kwargs)
    assert (fixed.num_thresholds, fixed.num_guesses) == (1, int(np.sum(TIED_IN >= 9))
                                                         + int(np.sum(TIED_OUT >= 9)))
    assert fixed.epsilon == pytest.approx(at_9, abs=2e-6)
    assert audit.epsilon_one_run_fdp(TIED_IN, TIED_OUT, threshold=9.0, **kwargs).epsilon == (
        pytest.approx(at_9_fdp, abs=2e-6))


def test_exhaustive_fdp_search_can_beat_jax_privacys_pruned_search():
    # JAX Privacy skips thresholds whose precision is below e^ε/(1 + e^ε) of the best ε
    # so far; for the f-DP bound that can skip the best one. Here its
    # CanaryScoreAuditor(...).epsilon_one_run_fdp(0.05, 1e-6) at that commit gives
    # 3.653351518054624 (54 of 54 guesses); 106 guesses (103 right) give more.
    rng = np.random.default_rng(18)
    in_scores, out_scores = rng.normal(2.5, 1, 200), rng.normal(0, 1, 200)
    kwargs = dict(significance=0.05, delta=1e-6)
    pruned = audit.epsilon_one_run_fdp(in_scores, out_scores, **kwargs)
    full = audit.epsilon_one_run_fdp(in_scores, out_scores, exhaustive=True, **kwargs)
    assert pruned.epsilon == pytest.approx(3.653351518054624, abs=2e-6)
    assert (pruned.num_guesses, pruned.num_correct) == (54, 54)
    assert full.epsilon > pruned.epsilon + 5e-3
    assert (full.num_guesses, full.num_correct) == (106, 103)
    # The bound at the thresholds found equals the count-level bound at the same level.
    assert full.epsilon == pytest.approx(audit.epsilon_one_run_fdp_from_counts(
        400, 106, 103, significance=0.05 / full.num_thresholds, delta=1e-6), abs=1e-9)


# ---------------------------------------------------- the p-value and closed forms

def test_p_value_equals_its_definition_term_by_term():
    # The grid of JAX Privacy's test_one_run_p_value, checked here against the sums.
    for m, k, wrong, epsilon, delta in itertools.product(
            (10, 100, 1000), (1, 10, 100), (0, 1, 10), (0, 0.5, 1.0), (0, 1e-6, 1e-3, 0.1)):
        if wrong > k or k > m:
            continue
        v = k - wrong
        assert audit.one_run_p_value(m, k, v, epsilon, delta) == pytest.approx(
            _naive_p_value(m, k, v, epsilon, delta), abs=1e-12)


@pytest.mark.parametrize("k, v, significance", [
    (10, 10, 0.05), (100, 100, 0.05), (100, 90, 0.05), (100, 90, 0.2), (1000, 700, 0.01),
    (50, 31, 0.1)])
def test_pure_dp_bound_is_the_clopper_pearson_logit(k, v, significance):
    # δ = 0: P[Binomial(k, q) ≥ v] = I_q(v, k − v + 1), so ε = logit(Beta⁻¹(τ; v, k − v + 1)).
    expected = max(0.0, float(special.logit(stats.beta.ppf(significance, v, k - v + 1))))
    assert audit.epsilon_one_run_from_counts(
        10_000, k, v, significance=significance, delta=0.0) == pytest.approx(expected, abs=1e-8)
    if v == k:   # all right: q^k = τ
        assert expected == pytest.approx(float(special.logit(significance ** (1 / k))))


def test_bound_sits_where_the_p_value_crosses_the_significance():
    for m, k, v, delta in [(1000, 100, 95, 1e-5), (20_000, 500, 480, 1e-6), (300, 30, 30, 1e-3)]:
        epsilon = audit.epsilon_one_run_from_counts(m, k, v, significance=0.05, delta=delta)
        assert epsilon > 0
        assert audit.one_run_p_value(m, k, v, epsilon, delta) == pytest.approx(0.05, rel=1e-6)
        assert audit.one_run_p_value(m, k, v, epsilon - 1e-4, delta) < 0.05
        assert audit.one_run_p_value(m, k, v, epsilon + 1e-4, delta) > 0.05


def test_no_evidence_gives_zero():
    assert audit.epsilon_one_run_from_counts(1000, 0, 0) == 0.0
    assert audit.epsilon_one_run_from_counts(1000, 100, 50) == 0.0     # precision ½
    assert audit.epsilon_one_run_fdp_from_counts(1000, 100, 0) == 0.0
    assert audit.one_run_p_value(1000, 100, 0, epsilon=2.0, delta=1e-5) == 1.0


GAUSSIAN_CASES = list(itertools.product((0.1, 1.0, 3.0, 10.0), (1e-8, 1e-5, 1e-2)))


def test_gaussian_mu_has_the_requested_delta():
    # δ(ε) of μ-GDP (Dong, Roth & Su 2019, Corollary 2.13) at the μ found is the δ asked for.
    for epsilon, delta in GAUSSIAN_CASES:
        mu = one_run_counts._gaussian_mu(epsilon, delta)
        exact = (stats.norm.cdf(-epsilon / mu + mu / 2)
                 - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2))
        assert exact == pytest.approx(delta, rel=1e-9)


@pytest.mark.skipif(not hasattr(dp_accounting, "get_sigma_gaussian"),
                    reason="this dp_accounting (0.4.3 has none) lacks get_sigma_gaussian")
def test_gaussian_mu_matches_dp_accounting():
    # JAX Privacy's f-DP estimator takes μ = 1 / dp_accounting.get_sigma_gaussian(ε, δ).
    for epsilon, delta in GAUSSIAN_CASES:
        assert one_run_counts._gaussian_mu(epsilon, delta) == pytest.approx(
            1 / dp_accounting.get_sigma_gaussian(epsilon, delta), rel=1e-9)


def test_fdp_margin_changes_sign_at_the_bound():
    m, k, v, tau, delta = 1000, 100, 95, 0.05, 1e-5
    epsilon = audit.epsilon_one_run_fdp_from_counts(m, k, v, significance=tau, delta=delta)

    def margin(eps):
        return one_run_counts._fdp_margin(m, k, v, tau, one_run_counts._gaussian_mu(eps, delta))
    assert margin(epsilon - 1e-4) > 0 >= margin(epsilon + 1e-4)


# ------------------------------------------------------------------ monotonicity

@pytest.mark.parametrize("bound", [audit.epsilon_one_run_from_counts,
                                   audit.epsilon_one_run_fdp_from_counts])
def test_more_correct_guesses_and_larger_significance_give_larger_bounds(bound):
    by_correct = [bound(2000, 200, v, significance=0.05, delta=1e-5)
                  for v in range(150, 201, 10)]
    assert all(b > a for a, b in zip(by_correct, by_correct[1:])), by_correct
    by_significance = [bound(2000, 200, 180, significance=s, delta=1e-5)
                       for s in (0.001, 0.01, 0.05, 0.2)]
    assert all(b > a for a, b in zip(by_significance, by_significance[1:])), by_significance
    by_delta = [bound(2000, 200, 180, significance=0.05, delta=d) for d in (1e-7, 1e-5, 1e-3)]
    assert all(b < a for a, b in zip(by_delta, by_delta[1:])), by_delta


def test_steinke_bound_shrinks_with_more_abstentions_when_delta_is_positive():
    # The 2mδ term: the same guesses among more canaries prove less (δ = 0: no change).
    bounds = [audit.epsilon_one_run_from_counts(m, 200, 190, delta=1e-4)
              for m in (200, 1000, 5000)]
    assert bounds[0] > bounds[1] > bounds[2]
    assert (audit.epsilon_one_run_from_counts(200, 200, 190, delta=0.0)
            == audit.epsilon_one_run_from_counts(5000, 200, 190, delta=0.0))


def test_bounds_depend_on_score_ranks_only():
    rng = np.random.default_rng(3)
    in_scores, out_scores = rng.normal(2, 1, 300), rng.normal(0, 1, 300)
    for estimator in (audit.epsilon_one_run, audit.epsilon_one_run_fdp):
        base = estimator(in_scores, out_scores).epsilon
        assert base > 0
        assert estimator(np.exp(in_scores), np.exp(out_scores)).epsilon == base
        assert estimator(rng.permutation(in_scores), out_scores[::-1]).epsilon == base
        # Higher must mean "in": the flipped attack proves nothing.
        assert estimator(-in_scores, -out_scores).epsilon == 0.0


def test_explicit_threshold_uses_the_counts_at_it():
    rng = np.random.default_rng(4)
    in_scores, out_scores = rng.normal(2, 1, 400), rng.normal(0, 1, 600)
    v, fp = int(np.sum(in_scores >= 2.5)), int(np.sum(out_scores >= 2.5))
    for estimator, from_counts in ((audit.epsilon_one_run, audit.epsilon_one_run_from_counts),
                                   (audit.epsilon_one_run_fdp,
                                    audit.epsilon_one_run_fdp_from_counts)):
        bound = estimator(in_scores, out_scores, threshold=2.5, significance=0.05, delta=1e-5)
        assert (bound.num_guesses, bound.num_correct, bound.threshold) == (v + fp, v, 2.5)
        assert bound.epsilon == from_counts(1000, v + fp, v, significance=0.05, delta=1e-5)


def test_search_visits_every_hull_vertex_and_pruning_is_exact_for_steinke():
    rng = np.random.default_rng(5)
    in_scores, out_scores = rng.normal(1.5, 1, 150), rng.normal(0, 1, 150)
    bound = audit.epsilon_one_run(in_scores, out_scores, significance=0.1, delta=1e-5)
    roc = metrics.roc_curve(in_scores, out_scores)
    hull = one_run._upper_hull(roc.false_positives.tolist(), roc.true_positives.tolist())
    level = 0.1 / hull.size
    every = max(audit.epsilon_one_run_from_counts(
        300, int(roc.true_positives[h] + roc.false_positives[h]), int(roc.true_positives[h]),
        significance=level, delta=1e-5) for h in hull)
    assert bound.num_thresholds == hull.size and bound.epsilon == pytest.approx(every, abs=1e-9)


def test_upper_hull_against_brute_force():
    rng = np.random.default_rng(6)
    for _ in range(20):
        roc = metrics.roc_curve(rng.integers(0, 6, 12) + 1.0, rng.integers(0, 6, 9) * 1.0)
        x, y = roc.false_positives.tolist(), roc.true_positives.tolist()
        points = sorted(set(zip(x, y)))

        def on_or_below_a_chord(p):   # of two other points, or right below one
            return any(a[0] <= p[0] <= b[0] and a != p != b and a[0] < b[0] and
                       (p[1] - a[1]) * (b[0] - a[0]) <= (b[1] - a[1]) * (p[0] - a[0])
                       for a, b in itertools.combinations(points, 2)) or any(
                q[0] == p[0] and q[1] > p[1] for q in points)
        # The ends (0, 0) (threshold +inf) and (n_out, n_in) are always vertices.
        expected = [p for p in points
                    if p in (points[0], points[-1]) or not on_or_below_a_chord(p)]
        assert points[0] == (0, 0) and points[-1] == (9, 12)
        hull = one_run._upper_hull(x, y)
        assert [(x[i], y[i]) for i in hull] == expected


# ----------------------------------------------------------------------- validity

def test_steinke_bound_is_valid_and_near_tight_for_randomized_response():
    # Each canary's bit is flipped with probability 1/(1 + e^ε0): exactly ε0-DP, and the
    # k guesses are right independently with probability q0. The exact probability
    # that the bound exceeds ε0 must be ≤ τ (δ = 0: the test is exact).
    k, epsilon0, tau = 60, 1.5, 0.2
    q0 = special.expit(epsilon0)
    bounds = np.array([audit.epsilon_one_run_from_counts(
        1000, k, v, significance=tau, delta=0.0) for v in range(k + 1)])
    exceed = float(np.sum(stats.binom.pmf(np.arange(k + 1), k, q0)[bounds > epsilon0]))
    assert 0.5 * tau < exceed <= tau
    # Near tight with many guesses: the median bound is close to ε0.
    median_v = int(stats.binom.median(1000, q0))
    assert audit.epsilon_one_run_from_counts(
        10_000, 1000, median_v, significance=0.05, delta=0.0) > 0.85 * epsilon0


def test_fdp_bound_is_valid_and_not_vacuous_for_a_gaussian_mechanism():
    # Score = μ·(in) + N(0, 1) per canary is μ-GDP in each canary, so the claim (ε0, δ)
    # with μ(ε0, δ) = μ is true: at most a fraction τ of runs may reject it. (One run
    # of 1000 canaries reaches about half of ε0 here, so this is a sanity check; the
    # reference values above pin the estimator down.)
    mu, delta, tau, m, trials = 1.0, 1e-5, 0.2, 1000, 100
    epsilon0 = optimize.brentq(lambda e: one_run_counts._gaussian_mu(e, delta) - mu, 0.1, 50)
    assert epsilon0 == pytest.approx(4.377, abs=1e-3)
    rng = np.random.default_rng(7)
    bounds = []
    for _ in range(trials):
        member = rng.random(m) < 0.5
        scores = rng.normal(0, 1, m) + mu * member
        bounds.append(audit.epsilon_one_run_fdp(scores[member], scores[~member], threshold=2.0,
                                                significance=tau, delta=delta).epsilon)
    assert np.mean(np.array(bounds) > epsilon0) <= tau
    assert np.median(bounds) > 0.5 * epsilon0


# ------------------------------------------------------- summary and the errors

def test_one_run_audit_reuses_the_metrics():
    rng = np.random.default_rng(8)
    in_scores, out_scores = rng.normal(1, 1, 400), rng.normal(0, 1, 400)
    result = audit.one_run_audit(in_scores, out_scores, significance=0.05, delta=1e-5,
                                 fprs=(0.01, 0.1))
    roc = metrics.roc_curve(in_scores, out_scores)
    assert result.auc == metrics.roc_auc(roc)
    assert result.tpr_at_fpr == {0.01: metrics.tpr_at_fpr(roc, 0.01),
                                 0.1: metrics.tpr_at_fpr(roc, 0.1)}
    assert result.one_run == audit.epsilon_one_run(in_scores, out_scores, delta=1e-5)
    assert result.one_run_fdp == audit.epsilon_one_run_fdp(in_scores, out_scores, delta=1e-5)


@pytest.mark.parametrize("call, match", [
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], significance=0), "significance"),
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], significance=1.0), "significance"),
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], significance=float("nan")), "significance"),
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], delta=-1e-5), "delta"),
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], delta=1.0), "delta"),
    (lambda: audit.epsilon_one_run_fdp([1, 2], [0, 1], delta=0.0), "delta must be in \\(0, 1\\)"),
    (lambda: audit.epsilon_one_run([], [0, 1]), "in_scores is empty"),
    (lambda: audit.epsilon_one_run_fdp([1, 2], []), "out_scores is empty"),
    (lambda: audit.epsilon_one_run([1, float("nan")], [0, 1]), "in_scores has 1 non-finite"),
    (lambda: audit.one_run_audit([1, 2], [0, np.inf]), "out_scores has 1 non-finite"),
    (lambda: audit.epsilon_one_run([1, 2], [0, 1], threshold=float("nan")), "threshold"),
    (lambda: audit.epsilon_one_run_from_counts(10, 5, 6), "num_correct ≤ num_guesses"),
    (lambda: audit.epsilon_one_run_from_counts(10, 11, 6), "num_guesses ≤ num_canaries"),
    (lambda: audit.epsilon_one_run_fdp_from_counts(10, 5.5, 5), "num_guesses must be a non"),
    (lambda: audit.epsilon_one_run_from_counts(True, 1, 1), "num_canaries must be a non"),
    (lambda: audit.epsilon_one_run_from_counts(0, 0, 0), "num_canaries ≥ 1"),
    (lambda: audit.one_run_p_value(10, 5, 5, epsilon=-1.0), "epsilon must be finite"),
    (lambda: audit.one_run_p_value(10, 5, 5, epsilon=1.0, delta=2.0), "delta"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_white_box_audit_without_noise_is_refused_before_loading_data():
    # Before: --noise_multiplier=0 passed the flag's check, then crashed deep in the audit.
    from tf_tempered.audit import one_run_experiment  # pylint: disable=g-import-not-at-top
    config = one_run_experiment.OneRunConfig(noise_multiplier=0.0, data_dir="/nonexistent")
    with pytest.raises(ValueError, match=r"white-box audit needs noise.*--audits=black_box"):
        one_run_experiment.run_one_run(config, log=lambda *_: None)
