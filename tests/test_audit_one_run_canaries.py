# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""One-run audits with canaries: the gradient-canary hook, the white-box scores, the
black-box audit with input canaries, and the ``one-run`` command."""

import json
import sys

import numpy as np
import pytest
from scipy import stats

from tf_tempered import data
from tf_tempered._compat import keras, tf
from tf_tempered.audit import (GradientCanaries, black_box_one_run, canary_scores,
                               likelihood_ratio_scores, one_run, step_signals,
                               white_box_one_run)
from tf_tempered.audit.black_box import split_canaries
from tf_tempered.privacy import make_private
from tf_tempered.privacy.accounting import compute_epsilon
from tf_tempered.keras_bridge import variable_key


def _dense(inputs=3, units=4, use_bias=True):
    model = keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(units,
                                                                         use_bias=use_bias)])
    return model


def _flat_hook_output(canaries, variables, counter):
    summed = {variable_key(v): tf.zeros(v.shape) for v in variables}
    out = canaries.hook(summed, variables, tf.constant(counter, tf.int64))
    return np.concatenate([out[variable_key(v)].numpy().ravel() for v in variables])


# ------------------------------------------------------------- the canaries' hook

@pytest.mark.parametrize("canary_norm", [None, 5.0])
def test_dirac_hook_adds_each_included_canary_clipped_to_c(canary_norm):
    variables = _dense().trainable_variables            # 3·4 + 4 = 16 coordinates
    canaries = GradientCanaries(variables, num_canaries=10, sampling_probability=1.0,
                                l2_norm_clip=2.0, canary_norm=canary_norm, seed=1)
    flat = _flat_hook_output(canaries, variables, counter=1)
    included = canaries.reveal_inclusion()
    expected = np.zeros(16)
    expected[canaries.coordinates] = 2.0 * canaries.signs * included   # ‖c·g‖ = C = 2
    np.testing.assert_allclose(flat, expected, atol=1e-6)
    assert len(set(canaries.coordinates.tolist())) == 10
    assert canaries.clipped_norm == 2.0


def test_hook_adds_to_the_clipped_sum_and_fills_unused_variables():
    model = _dense()
    kernel, bias = model.trainable_variables
    canaries = GradientCanaries([kernel, bias], num_canaries=16, sampling_probability=1.0,
                                l2_norm_clip=1.0, seed=0)
    summed = {variable_key(kernel): tf.ones(kernel.shape)}   # bias: not in this step's sum
    out = canaries.hook(dict(summed), [kernel, bias], tf.constant(3, tf.int64))
    flat = np.r_[out[variable_key(kernel)].numpy().ravel(), out[variable_key(bias)].numpy()]
    expected = np.r_[np.ones(12), np.zeros(4)]
    expected[canaries.coordinates] += canaries.signs * canaries.reveal_inclusion()
    np.testing.assert_allclose(flat, expected, atol=1e-6)


def test_random_directions_are_unit_and_summed_when_included():
    variables = _dense(8, 8).trainable_variables        # 72 coordinates
    canaries = GradientCanaries(variables, num_canaries=20, sampling_probability=1.0,
                                l2_norm_clip=1.5, kind="random", seed=2)
    np.testing.assert_allclose(np.linalg.norm(canaries.directions, axis=1), 1.0)
    flat = _flat_hook_output(canaries, variables, counter=7)
    expected = 1.5 * canaries.reveal_inclusion() @ canaries.directions
    np.testing.assert_allclose(flat, expected, atol=1e-5)
    np.testing.assert_allclose(canaries.project(flat),
                               canaries.directions @ expected, atol=1e-5)


FALSE_ALARM = 1e-6   # per check, as the suite's other tests of secret draws (noise_statistics)


def test_each_step_samples_an_included_canary_with_probability_q():
    variables = _dense(50, 40).trainable_variables      # 2040 coordinates
    canaries = GradientCanaries(variables, num_canaries=2000, sampling_probability=0.1,
                                l2_norm_clip=1.0, seed=3)
    included = canaries.reveal_inclusion()
    steps = [np.abs(canaries.project(_flat_hook_output(canaries, variables, c))) > 0.5
             for c in (1, 2, 3)]
    for sampled in steps:
        assert not np.any(sampled & ~included)          # never an excluded canary
        count = int(np.sum(sampled))
        # The draws use the secret key (OS entropy): a false alarm has probability
        # ≤ 6·FALSE_ALARM per run; q = 0.05 or 0.15 would fail (≈ 5σ off at n ≈ 1000).
        assert stats.binom.cdf(count, included.sum(), 0.1) > FALSE_ALARM
        assert stats.binom.sf(count - 1, included.sum(), 0.1) > FALSE_ALARM
    assert np.sum(steps[0] != steps[1]) > 50             # fresh draws per counter
    again = np.abs(canaries.project(_flat_hook_output(canaries, variables, 1))) > 0.5
    np.testing.assert_array_equal(again, steps[0])       # one draw per counter


def test_inclusion_is_secret_and_fair():
    variables = _dense(100, 50).trainable_variables
    first, second = (GradientCanaries(variables, num_canaries=4000, sampling_probability=0.5,
                                      l2_norm_clip=1.0, seed=4) for _ in range(2))
    np.testing.assert_array_equal(first.coordinates, second.coordinates)   # public, seeded
    assert np.mean(first.reveal_inclusion() != second.reveal_inclusion()) > 0.4  # not seeded
    assert 1800 < first.reveal_inclusion().sum() < 2200
    assert "included" not in repr(first) and "4000 dirac" in repr(first)


@pytest.mark.parametrize("kwargs, match", [
    (dict(num_canaries=17), "17 Dirac canaries need as many distinct coordinates"),
    (dict(num_canaries=1), "num_canaries must be an integer ≥ 2"),
    (dict(num_canaries=True), "num_canaries must be an integer"),
    (dict(kind="gaussian"), "canary kind must be one of"),
    (dict(sampling_probability=0.0), "sampling_probability must be in"),
    (dict(canary_norm=-1.0), "canary_norm must be > 0"),
])
def test_canary_errors_name_the_argument(kwargs, match):
    arguments = dict(num_canaries=4, sampling_probability=0.5, l2_norm_clip=1.0)
    with pytest.raises(ValueError, match=match):
        GradientCanaries(_dense().trainable_variables, **{**arguments, **kwargs})


def test_install_needs_a_private_model():
    model = _dense()
    canaries = GradientCanaries(model.trainable_variables, num_canaries=4,
                                sampling_probability=0.5, l2_norm_clip=1.0)
    with pytest.raises(ValueError, match="make_private"):
        canaries.install(model)


# ------------------------------------------------ white-box signals, end to end

def test_signals_are_the_inclusion_when_the_examples_give_no_gradient():
    # x = 0 and no bias: the examples' gradient is 0, so each update is the canaries
    # plus the noise. q = 1 (batch = N): every included canary is in every step, so
    # y[t, i] = b_i + N(0, σ²) with σ = 0.01.
    def model_fn():
        return _dense(8, 4, use_bias=False)

    x, y = np.zeros((16, 8), np.float32), np.zeros(16, np.int64)
    result = white_box_one_run(model_fn, x, y, num_canaries=32, l2_norm_clip=1.0,
                               noise_multiplier=0.01, batch_size=16, epochs=5,
                               learning_rate=0.5, score="sum", log=None,
                               loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert result.steps == 5 and result.settings["sampling_probability"] == 1.0
    # sum score = Σ_t y = 5·b_i + N(0, 5σ²): in near 5, out near 0.
    np.testing.assert_allclose(result.in_scores, 5.0, atol=0.15)
    np.testing.assert_allclose(result.out_scores, 0.0, atol=0.15)
    assert result.audit.auc == 1.0


def test_step_signals_undo_sgd_and_sum_telescopes():
    rng = np.random.default_rng(5)
    projections = np.cumsum(rng.normal(size=(11, 6)), axis=0)
    signals = step_signals(projections, learning_rate=0.1, normalizer=64, clipped_norm=2.0)
    np.testing.assert_allclose(signals[3], -(projections[4] - projections[3]) * 64 / 0.2)
    np.testing.assert_allclose(canary_scores.sum_scores(signals),
                               (projections[0] - projections[-1]) * 64 / 0.2)
    with pytest.raises(ValueError, match="at least one step"):
        step_signals(projections[:1], learning_rate=0.1, normalizer=64, clipped_norm=2.0)


def test_likelihood_ratio_score_by_hand_and_the_centring_rule():
    rng = np.random.default_rng(6)
    q, sigma = 0.05, 1.3
    signals = rng.normal(0.2, sigma, (300, 40))
    by_hand = np.sum(np.log(1 - q + q * np.exp((signals - 0.5) / sigma ** 2)), axis=0)
    np.testing.assert_allclose(likelihood_ratio_scores(
        signals, sampling_probability=q, noise_multiplier=sigma), by_hand, rtol=1e-10)
    # σ̂ ≈ 1.3 > ½: no centring by default; σ̂ ≈ 0.13 ≤ ½: each canary's median first.
    assert canary_scores.noise_scale(signals) == pytest.approx(sigma, rel=0.05)
    small = signals / 10
    centred = small - np.median(small, axis=0)
    np.testing.assert_allclose(
        likelihood_ratio_scores(small, sampling_probability=q),
        likelihood_ratio_scores(centred, sampling_probability=q, center=False,
                                noise_multiplier=canary_scores.noise_scale(small)))


@pytest.mark.parametrize("noise_scale, exceeds", [(1.5, False), (0.15, True)])
def test_scores_of_the_exact_mechanism_bound_epsilon_validly(noise_scale, exceeds):
    # The subsampled Gaussian mechanism the white-box audit sees, simulated: σ = 1.5,
    # q = 0.05, 300 steps, 2000 canaries: accounted ε = 3.18. The audit stays below it
    # with σ as accounted (about 0.8 / 1.0 measured) and exceeds it with a tenth of the
    # noise (5.4 / 9.5).
    q, steps, m = 0.05, 300, 2000
    epsilon = compute_epsilon(num_examples=1000, batch_size=50, noise_multiplier=1.5,
                              steps=steps, delta=1e-5)
    assert epsilon == pytest.approx(3.184, abs=1e-3)
    rng = np.random.default_rng(7)
    included = rng.random(m) < 0.5
    signals = ((rng.random((steps, m)) < q) * included
               + rng.normal(0, noise_scale, (steps, m)))
    scores = likelihood_ratio_scores(signals, sampling_probability=q)
    audit = one_run.one_run_audit(scores[included], scores[~included])
    for bound in (audit.one_run.epsilon, audit.one_run_fdp.epsilon):
        assert (bound > epsilon) == exceeds, (bound, epsilon)
    assert audit.one_run_fdp.epsilon > 0.5                 # the audit has power


# --------------------------------------------------------------------- black box

def test_split_canaries_takes_mislabelled_examples_out():
    x, y = np.arange(40.0).reshape(20, 2), np.arange(20) % 5
    (rest_x, rest_y), canary_x, canary_y = split_canaries(x, y, 6, seed=1)
    assert rest_x.shape == (14, 2) and canary_x.shape == (6, 2)
    taken = canary_x[:, 0] // 2
    assert not set(taken.tolist()) & set((rest_x[:, 0] // 2).tolist())
    assert np.all(canary_y != y[taken.astype(int)]) and np.all((0 <= canary_y) & (canary_y < 5))
    with pytest.raises(ValueError, match="num_canaries=20 must be below"):
        split_canaries(x, y, 20)


def test_black_box_audit_sees_its_own_canaries():
    # The caller's canaries: canary i is a one-hot input on a coordinate of its own,
    # with a random label, so only its own steps (and the noise) move its loss.
    n, m = 400, 200
    rng = np.random.default_rng(8)
    x = np.zeros((n, 64 + m), np.float32)
    x[:, :64] = data.load("digits").x_train.reshape(-1, 64)[:n]
    y = data.load("digits").y_train[:n]
    canary_x = np.zeros((m, 64 + m), np.float32)
    canary_x[np.arange(m), 64 + np.arange(m)] = 1.0
    result = black_box_one_run(
        lambda: _dense(64 + m, 10, use_bias=False), x, y, num_canaries=m,
        canary_x=canary_x, canary_y=rng.integers(0, 10, m), l2_norm_clip=1.0,
        noise_multiplier=0.3, batch_size=40, epochs=8, learning_rate=2.0,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), log=None)
    # Every canary stays in the arrays (weight 0 when out): N = 600, q = 40/600.
    assert result.settings["num_examples"] == n + m and result.steps == 8 * 15
    assert result.epsilon == pytest.approx(compute_epsilon(
        num_examples=600, batch_size=40, noise_multiplier=0.3, steps=120, delta=1e-5))
    assert 0.5 < result.audit.one_run.epsilon < result.epsilon
    assert result.audit.auc > 0.7
    json.dumps(result.to_dict())
    assert "black_box: accounted ε" in result.summary()


def test_audit_refuses_a_model_that_is_already_private():
    model = make_private(_dense(), l2_norm_clip=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="fresh model"):
        white_box_one_run(lambda: model, np.zeros((8, 3)), np.zeros(8), num_canaries=4,
                          l2_norm_clip=1.0, noise_multiplier=1.0, batch_size=4, epochs=1,
                          loss="mse", log=None)
    with pytest.raises(ValueError, match="no loss"):
        black_box_one_run(_dense, np.zeros((8, 3)), np.arange(8) % 2, num_canaries=2,
                          l2_norm_clip=1.0, noise_multiplier=1.0, batch_size=4, epochs=1,
                          log=None)


# ----------------------------------------------------------------- the command

# keras3_suite: the command line, as tests/test_audit_one_run.py (the Keras 2 suite runs the
# audits it calls, above).
@pytest.mark.keras3_suite
def test_one_run_command_prints_bounds_and_writes_json_and_plot(tmp_path, capsys):
    from absl import flags
    from tf_tempered.audit import one_run_cli
    fv = flags.FlagValues()
    one_run_cli.define_flags(fv)
    fv(["audit", "--dataset=digits", "--num_train=400", "--epochs=1", "--num_canaries=100",
        f"--output_dir={tmp_path}", "--noise_multiplier=1.0"])
    results = one_run_cli.main(flag_values=fv)
    printed = capsys.readouterr().out
    assert [r.kind for r in results] == ["white_box", "black_box"]
    assert "[white-box] epoch 1/1" in printed and "[black-box] epoch 1/1" in printed
    assert printed.count("accounted ε") >= 2 and "(Steinke et al.)" in printed
    saved = json.loads((tmp_path / "one_run_results.json").read_text())
    assert [a["kind"] for a in saved["audits"]] == ["white_box", "black_box"]
    assert saved["audits"][0]["epsilon_accounted"] == pytest.approx(results[0].epsilon)
    assert saved["config"]["num_canaries"] == 100
    assert (tmp_path / "one_run_audit.png").stat().st_size > 10_000


def test_audit_command_dispatches_the_one_run_subcommand(monkeypatch):
    from tf_tempered.audit import cli, one_run_cli
    calls = []
    monkeypatch.setattr(one_run_cli, "run", calls.append)
    monkeypatch.setattr(sys, "argv", ["audit", "one-run", "--epochs=2"])
    cli.run()
    assert calls == [["audit", "--epochs=2"]]
