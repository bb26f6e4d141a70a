# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""The white-box one-run audit finds a broken DP engine, and passes the real one.

One setting for all three runs: a tanh MLP (2 410 parameters) on digits, C = 1,
σ = 1.5, Poisson batches of expected size 64 (q = 64/1438), 8 epochs (176 steps):
accounted ε = 2.16 at δ = 1e-5. 1000 Dirac gradient canaries of norm 10·C, which the
engine's clip stage must clip to C. Then

* the real engine: both lower bounds stay below the accounted ε (measured: about
  0.1–0.2; each bound exceeds ε with probability ≤ 5% if the engine is right);
* the clip stage monkeypatched to clip nothing (c_m = 1): the canaries enter at
  10·C, as do the examples' gradients: the bounds exceed ε (measured 4.6 / 7.8);
* the noise stage given σ/10 while the accountant keeps σ: the bounds exceed ε
  (measured 3.7–4.0 / 5.7–6.5).

The breakages are monkeypatched here only: the engine has no switch that weakens it.
"""

import numpy as np
import pytest

from tf_tempered import data
from tf_tempered._compat import keras
from tf_tempered.audit import white_box_one_run
from tf_tempered.privacy.accounting import compute_epsilon
from tf_tempered.privacy.settings import DPConfig
from tf_tempered.privacy.step import clip_factors as clip_factor_stage
from tf_tempered.privacy.step import chunks, plan

SIGMA, CLIP, BATCH, EPOCHS, CANARIES = 1.5, 1.0, 64, 8, 1000


@pytest.fixture(scope="module")
def digits():
    ds = data.load("digits")
    return ds.x_train.reshape(len(ds.x_train), -1), ds.y_train


def _mlp():
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="tanh"),
                             keras.layers.Dense(10)])


def _audit(digits):
    x, y = digits
    return white_box_one_run(
        _mlp, x, y, num_canaries=CANARIES, l2_norm_clip=CLIP, noise_multiplier=SIGMA,
        batch_size=BATCH, epochs=EPOCHS, learning_rate=0.5, canary_norm=10 * CLIP,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), log=None)


def _accounted(digits):
    steps = EPOCHS * round(len(digits[1]) / BATCH)
    return compute_epsilon(num_examples=len(digits[1]), batch_size=BATCH,
                           noise_multiplier=SIGMA, steps=steps, delta=1e-5)


def test_real_engine_stays_below_the_accounted_epsilon(digits):
    result = _audit(digits)
    assert result.steps == 176 and result.num_canaries == CANARIES
    assert result.epsilon == pytest.approx(_accounted(digits), rel=1e-9)
    assert result.epsilon == pytest.approx(2.158, abs=1e-3)
    assert result.audit.one_run.significance == 0.05
    assert 0 <= result.audit.one_run.epsilon < result.epsilon
    assert 0 <= result.audit.one_run_fdp.epsilon < result.epsilon
    assert 400 < len(result.in_scores) < 600   # inclusion ~ Binomial(1000, ½)


def test_engine_that_does_not_clip_fails_the_audit(digits, monkeypatch):
    clip_factors = clip_factor_stage.clip_factors

    def no_clipping(layers, num_microbatches, l2_norm_clip):
        norm, finite, weights = clip_factors(layers, num_microbatches, l2_norm_clip)
        return norm, finite, type(weights)(weights.finite, weights.finite)  # c_m = 1

    monkeypatch.setattr(clip_factor_stage, "clip_factors", no_clipping)  # the canaries' clipping
    monkeypatch.setattr(chunks, "clip_factors", no_clipping)   # the examples'
    result = _audit(digits)
    assert result.epsilon == pytest.approx(_accounted(digits), rel=1e-9)
    assert result.audit.one_run.epsilon > result.epsilon + 1.0
    assert result.audit.one_run_fdp.epsilon > result.epsilon + 2.0
    assert result.audit.tpr_at_fpr[0.01] > 0.5


def test_engine_that_adds_a_tenth_of_the_noise_fails_the_audit(digits, monkeypatch):
    require_dp_settings = plan.require_dp_settings

    def tenth_of_the_noise(model):   # the step's settings only; fit accounts with σ
        config = require_dp_settings(model)
        return DPConfig(config.l2_norm_clip, config.noise_stddev / 10,
                        config.num_microbatches, noise_multiplier=config.noise_multiplier)

    monkeypatch.setattr(plan, "require_dp_settings", tenth_of_the_noise)
    result = _audit(digits)
    assert result.epsilon == pytest.approx(_accounted(digits), rel=1e-9)
    assert result.audit.one_run.epsilon > result.epsilon + 0.5
    assert result.audit.one_run_fdp.epsilon > result.epsilon + 1.5
    assert np.median(result.in_scores) > np.quantile(result.out_scores, 0.9)
