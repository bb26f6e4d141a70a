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
"""Empirical privacy audit: metrics by hand, the DP bound, attacks on real models, the script."""

import math
import pathlib

import numpy as np
import pytest
from scipy import stats
from sklearn import metrics as sk_metrics

from tf_tempered import audit
from tf_tempered.audit import attacks, canaries, metrics

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


# ---------------------------------------------------------------- metrics by hand

def test_auc_of_tiny_example():
    # Pairs (member, non-member) won: 0.9 and 0.8 beat all 3, 0.4 beats 2 -> 8/9.
    roc = metrics.roc_curve([0.9, 0.8, 0.4], [0.7, 0.3, 0.2])
    assert metrics.roc_auc(roc) == pytest.approx(8 / 9)
    # Ties count one half: every pair ties or splits evenly.
    assert metrics.roc_auc(metrics.roc_curve([1, 0], [1, 0])) == pytest.approx(0.5)
    assert metrics.roc_auc(metrics.roc_curve([2, 2], [1, 1])) == 1.0
    assert metrics.roc_auc(metrics.roc_curve([1, 1], [2, 2])) == 0.0


def test_auc_and_advantage_match_sklearn_on_random_scores():
    rng = np.random.default_rng(1)
    members, nonmembers = rng.normal(0.5, 1, 300).round(1), rng.normal(0, 1, 200).round(1)
    roc = metrics.roc_curve(members, nonmembers)
    y = np.r_[np.ones(300), np.zeros(200)]
    scores = np.r_[members, nonmembers]
    assert roc.auc == pytest.approx(sk_metrics.roc_auc_score(y, scores))
    fpr, tpr, _ = sk_metrics.roc_curve(y, scores)
    assert roc.advantage == pytest.approx(np.max(tpr - fpr))


def test_advantage_by_hand():
    # Threshold 4: TPR 2/3, FPR 0. Threshold 1: TPR 1, FPR 2/3.
    roc = metrics.roc_curve([5, 4, 1], [3, 2, 0])
    assert metrics.attacker_advantage(roc) == pytest.approx(2 / 3)
    assert metrics.attacker_advantage(metrics.roc_curve([0, 0], [1, 1])) == 0.0


def test_tpr_at_fpr_on_constructed_scores():
    nonmembers = np.arange(1000.0)                     # 0, 1, ..., 999
    members = np.r_[[1000.5] * 50, [998.5] * 50, [991.5] * 100, [0.5] * 300]
    roc = metrics.roc_curve(members, nonmembers)
    assert metrics.tpr_at_fpr(roc, 0.0) == pytest.approx(50 / 500)
    # FPR ≤ 0.1% allows one false positive (999): threshold 998.5 -> 100 members.
    assert metrics.tpr_at_fpr(roc, 0.001) == pytest.approx(100 / 500)
    # FPR ≤ 1% allows ten (990..999): threshold 991.5 (8 false positives) -> 200 members.
    assert metrics.tpr_at_fpr(roc, 0.01) == pytest.approx(200 / 500)
    assert metrics.tpr_at_fpr(roc, 1.0) == 1.0
    with pytest.raises(ValueError, match="fpr"):
        metrics.tpr_at_fpr(roc, 1.5)


def test_roc_rejects_bad_scores():
    with pytest.raises(ValueError, match="non-finite"):
        metrics.roc_curve([0.0, np.nan], [1.0])
    with pytest.raises(ValueError, match="empty"):
        metrics.roc_curve([], [1.0])


@pytest.mark.parametrize("k,n", [(0, 20), (1, 20), (7, 20), (19, 20), (20, 20), (3, 1000)])
def test_clopper_pearson_matches_beta_quantiles(k, n):
    lower, upper = metrics.clopper_pearson(k, n, confidence=0.9)
    expected_lower = 0.0 if k == 0 else stats.beta.ppf(0.05, k, n - k + 1)
    expected_upper = 1.0 if k == n else stats.beta.ppf(0.95, k + 1, n - k)
    assert float(lower) == pytest.approx(expected_lower, abs=1e-12)
    assert float(upper) == pytest.approx(expected_upper, abs=1e-12)
    exact = stats.binomtest(k, n).proportion_ci(confidence_level=0.9, method="exact")
    assert (float(lower), float(upper)) == pytest.approx((exact.low, exact.high), abs=1e-9)


def test_epsilon_lower_bound_by_hand():
    # 80 of 100 members and 10 of 100 non-members above threshold 1.
    members, nonmembers = np.r_[np.ones(80), np.zeros(20)], np.r_[np.ones(10), np.zeros(90)]
    delta = 1e-3
    bound = metrics.epsilon_lower_bound(metrics.roc_curve(members, nonmembers), delta=delta)
    tpr_lo = stats.beta.ppf(0.025, 80, 21)
    fpr_hi = stats.beta.ppf(0.975, 11, 90)
    expected = max(math.log((tpr_lo - delta) / fpr_hi),
                   math.log((1 - fpr_hi - delta) / (1 - tpr_lo)))
    assert bound.epsilon == pytest.approx(expected)
    assert bound.threshold == 1.0
    assert bound.point_estimate == pytest.approx(max(math.log((0.8 - delta) / 0.1),
                                                     math.log((0.9 - delta) / 0.2)))
    # A useless attack shows nothing.
    assert metrics.epsilon_lower_bound(metrics.roc_curve([0, 1], [0, 1])).epsilon == 0.0


@pytest.mark.parametrize("rank,candidates,expected", [
    (1, 8, 3.0), (8, 8, 0.0), (2, 1024, 9.0), (1, 10, math.log2(10)), (5, 10, 1.0)])
def test_exposure_for_known_ranks(rank, candidates, expected):
    assert metrics.exposure(rank, candidates) == pytest.approx(expected)


def test_exposure_rejects_bad_ranks():
    with pytest.raises(ValueError, match="rank"):
        metrics.exposure(0, 10)
    with pytest.raises(ValueError, match="rank"):
        metrics.exposure(11, 10)


def test_canary_ranks_and_exposure_from_logits():
    logits = np.array([[0.0, 5.0, 1.0, 2.0],     # secret 1: best -> rank 1
                       [3.0, 0.0, 2.0, 1.0],     # secret 2: behind 0 -> rank 2
                       [1.0, 1.0, 1.0, 1.0],     # all tie: ties count against -> rank 4
                       [0.0, 1.0, 2.0, 3.0]])    # secret 0: last -> rank 4
    report = canaries.canary_exposure(logits, [1, 2, 3, 0])
    assert report.ranks.tolist() == [1, 2, 4, 4]
    np.testing.assert_allclose(report.exposures, [2.0, 1.0, 0.0, 0.0])
    assert report.mean == pytest.approx(0.75) and report.max == 2.0


def test_mislabeled_canaries_get_uniform_wrong_labels():
    y = np.repeat(np.arange(10), 500)
    c = canaries.mislabeled_canaries(np.zeros((y.size, 1)), y, num_classes=10, seed=3)
    assert np.all(c.labels != c.true_labels) and np.array_equal(c.true_labels, y)
    counts = np.bincount((c.labels - y) % 10, minlength=10)
    assert counts[0] == 0 and counts[1:].min() > 450   # shifts 1..9 about equally often


# ---------------------------------------------------------------- the DP bound

def _randomized_response(epsilon, n, rng):
    """Scores of (ε, 0)-DP randomized response of the membership bit (1 = "member")."""
    keep = math.exp(epsilon) / (1 + math.exp(epsilon))
    return (rng.random(n) < keep).astype(float), (rng.random(n) >= keep).astype(float)


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_bound_does_not_exceed_epsilon_of_randomized_response(epsilon):
    rng = np.random.default_rng(0)
    bounds = np.array([
        metrics.epsilon_lower_bound(metrics.roc_curve(*_randomized_response(epsilon, 500, rng)),
                                    delta=1e-5).epsilon for _ in range(200)])
    assert np.mean(bounds > epsilon) <= 0.05      # nominal: at most 5% at 95% confidence
    assert np.all(bounds < 1.5 * epsilon)


def test_bound_is_positive_for_large_epsilon():
    rng = np.random.default_rng(1)
    for _ in range(20):
        bound = metrics.epsilon_lower_bound(
            metrics.roc_curve(*_randomized_response(4.0, 500, rng)), delta=1e-5)
        assert 2.5 < bound.epsilon <= 4.5
        assert bound.threshold == 1.0


def test_split_bound_is_valid_for_continuous_laplace_scores():
    # Laplace mechanism on the membership bit (sensitivity 1): ε-DP, many thresholds.
    rng = np.random.default_rng(2)
    epsilon = 2.0
    bounds = np.array([metrics.split_epsilon_lower_bound(
        1 + rng.laplace(0, 1 / epsilon, 1000), rng.laplace(0, 1 / epsilon, 1000),
        seed=i).epsilon for i in range(40)])
    assert np.mean(bounds > epsilon) <= 0.05 and np.mean(bounds) > 0.5 * epsilon


# ---------------------------------------------------------------- attacks on synthetic scores

def test_lira_beats_global_threshold_on_per_example_gaussians():
    rng = np.random.default_rng(0)
    num_shadow, n = 16, 400
    difficulty = rng.normal(0, 3, n)              # per-example offsets hide a global signal
    keep = attacks.balanced_keep(num_shadow, n, seed=1)
    shadow = difficulty + 1.5 * keep + rng.normal(0, 0.5, (num_shadow, n))
    is_member = rng.random(n) < 0.5
    target = difficulty + 1.5 * is_member + rng.normal(0, 0.5, n)
    online = attacks.lira_attack(target, shadow, keep, is_member)
    offline = attacks.lira_attack(target, shadow, keep, is_member, online=False)
    global_threshold = attacks.threshold_attack(target[is_member], target[~is_member])
    assert online.name == "lira_online" and offline.name == "lira_offline"
    assert online.auc > 0.9 and offline.auc > 0.85
    assert global_threshold.auc < 0.75
    per_example = attacks.lira_attack(target, shadow, keep, is_member, fix_variance=False)
    assert per_example.auc > 0.85


def test_shadow_scores_calls_training_with_balanced_halves():
    calls = []

    def train_and_score(keep, seed):
        calls.append((keep.copy(), seed))
        return np.where(keep, 1.0, 0.0)

    scores, keep = attacks.shadow_scores(train_and_score, 6, num_shadow=4, seed=10)
    assert [seed for _, seed in calls] == [11, 12, 13, 14]
    assert keep.sum(axis=0).tolist() == [2] * 6
    np.testing.assert_array_equal(scores, keep.astype(float))


def test_loss_and_confidence_attacks_on_logits():
    member_logits = np.array([[5.0, 0.0], [0.0, 4.0], [3.0, 0.0]])
    nonmember_logits = np.array([[0.5, 0.0], [0.0, 1.0], [0.0, 3.5]])
    loss = attacks.loss_attack(member_logits, [0, 1, 0], nonmember_logits, [0, 1, 0])
    assert loss.auc == 1.0 and loss.advantage == 1.0
    # Label-free: the third non-member is confident (in the wrong class).
    conf = attacks.confidence_attack(member_logits, None, nonmember_logits, None)
    assert conf.auc == pytest.approx(8 / 9)
    same = attacks.confidence_attack(member_logits, [0, 1, 0], nonmember_logits, [0, 1, 0],
                                     use_label=True)
    assert same.auc == loss.auc
    assert audit.per_example_loss(member_logits, [0, 1, 0])[0] == pytest.approx(
        math.log1p(math.exp(-5.0)))


# ---------------------------------------------------------------- attacks on trained models

DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"   # as conftest.py
NUM_MEMBERS = 250


@pytest.fixture(scope="module")
def mnist_split():
    """A pool of 2·250 MNIST training images split at random into members and non-members."""
    if not (DATA_DIR / "mnist").is_dir():
        pytest.skip(f"{DATA_DIR / 'mnist'} not present")
    from tf_tempered import data
    ds = data.load("mnist", data_dir=str(DATA_DIR), num_train=2 * NUM_MEMBERS, num_test=0,
                   allow_tfds=False)
    x, y = ds.x_train.reshape(2 * NUM_MEMBERS, -1), ds.y_train
    order = np.random.default_rng(0).permutation(2 * NUM_MEMBERS)
    return (x[order[:NUM_MEMBERS]], y[order[:NUM_MEMBERS]],
            x[order[NUM_MEMBERS:]], y[order[NUM_MEMBERS:]])


def _mlp(activation, units):
    from tf_tempered._compat import keras
    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(units, activation=activation),
                             keras.layers.Dense(10)])


def _attack_all(model, split, delta):
    xm, ym, xn, yn = split
    lm, ln = model.predict(xm, verbose=0), model.predict(xn, verbose=0)
    return (attacks.loss_attack(lm, ym, ln, yn, delta=delta),
            attacks.confidence_attack(lm, ym, ln, yn, delta=delta),
            float(np.mean(np.argmax(ln, axis=1) == yn)))


def test_attack_detects_overfit_nonprivate_model(mnist_split):
    from tf_tempered._compat import keras
    keras.utils.set_random_seed(0)
    model = _mlp("relu", 256)
    model.compile(keras.optimizers.Adam(0.003),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(mnist_split[0], mnist_split[1], batch_size=50, epochs=60, verbose=0)
    loss, confidence, heldout_accuracy = _attack_all(model, mnist_split, 1e-5)
    assert heldout_accuracy > 0.7
    assert loss.auc > 0.6 and confidence.auc > 0.6
    assert loss.advantage > 0.2
    assert loss.epsilon_lb.epsilon > 1.0   # a non-private model leaks: ε is clearly > 0


def test_dp_model_bound_never_exceeds_accounted_epsilon(mnist_split):
    from tf_tempered._compat import keras
    from tf_tempered.privacy import DPKerasSGDOptimizer, make_private
    from tf_tempered.privacy.accounting import compute_epsilon
    from tf_tempered.privacy.sampling import poisson_batches
    delta, batch, steps, sigma = 1e-5, 100, 50, 4.0     # accounted ε ≈ 3.4
    keras.utils.set_random_seed(0)
    # A deterministic test: the noise and batches from the (non-private) opt-in.
    model = make_private(_mlp("tanh", 32), insecure_dp_seed=0)
    model.compile(DPKerasSGDOptimizer(
        l2_norm_clip=1.0, noise_multiplier=sigma, learning_rate=1.0),
        loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True, reduction="none"))
    model.fit(poisson_batches(mnist_split[0], mnist_split[1], expected_batch_size=batch,
                              steps=steps, insecure_dp_seed=0), verbose=0)
    epsilon = compute_epsilon(num_examples=NUM_MEMBERS, batch_size=batch,
                              noise_multiplier=sigma, steps=steps, delta=delta)
    loss, confidence, heldout_accuracy = _attack_all(model, mnist_split, delta)
    assert heldout_accuracy > 0.4                 # it learned something
    for result in (loss, confidence):
        assert result.epsilon_lb.epsilon <= epsilon
        assert result.epsilon_lb_split.epsilon <= epsilon
        assert result.epsilon_lb.delta == delta


# ---------------------------------------------------------------- the script

@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_script_trains_audits_saves_and_reloads(tmp_path, capsys):
    if not (DATA_DIR / "mnist").is_dir():
        pytest.skip(f"{DATA_DIR / 'mnist'} not present")
    from absl import flags
    from tf_tempered.audit import cli
    assert "num_canaries" not in flags.FLAGS      # nothing defined at import time
    fv = flags.FlagValues()
    cli.define_flags(fv)
    out = tmp_path / "audit"
    fv(["audit", "--num_train=60", "--epochs=2", "--num_canaries=3", "--batch_size=20",
        "--num_shadow=2", f"--data_dir={DATA_DIR}", f"--output_dir={out}",
        "--noise_multiplier=1.0"])
    audits = cli.main(flag_values=fv)
    printed = capsys.readouterr().out
    assert [a.name for a in audits] == ["non-private", "dp-sgd"]
    assert [a.name for a in audits[1].attacks] == ["loss", "confidence", "lira_online",
                                                   "lira_offline"]
    assert "eps_lb(95%CP)" in printed and "exposure mean/max" in printed
    for name in ("roc_linear.png", "roc_loglog.png", "results.json", "nonprivate.keras",
                 "dp.keras", "audit_config.json"):
        assert (out / name).is_file(), name
    assert math.isinf(audits[0].epsilon) and 0 < audits[1].epsilon < math.inf
    assert audits[0].exposure.ranks.shape == (3,)

    fv = flags.FlagValues()
    cli.define_flags(fv)
    fv(["audit", f"--model_path={out}", "--output_dir=", "--num_train=7", "--num_shadow=0"])
    reloaded = cli.main(flag_values=fv)
    for before, after in zip(audits, reloaded):
        assert after.attacks[0].auc == pytest.approx(before.attacks[0].auc)
        assert after.epsilon == pytest.approx(before.epsilon)


def test_saved_models_without_their_run_configuration_are_refused(tmp_path):
    # Before: the flags' defaults (σ 1.1, 40 epochs) stood in for how dp.keras was trained,
    # and the audit printed their ε (10.28 for a model whose run spent 16.28).
    from tf_tempered.audit import experiment  # pylint: disable=g-import-not-at-top
    (tmp_path / "dp.keras").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"not audit_config.json.*Fix: pass the folder "
                       r"an audit run wrote"):
        experiment.run_audit(experiment.AuditConfig(), model_path=str(tmp_path),
                             log=lambda *_: None)
