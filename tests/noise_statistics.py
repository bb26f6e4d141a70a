# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Statistical checks of DP noise, shared by the sampler tests and the engine's.

The draws are secret (not seeded), so every check can fail by chance: each is set for a
false alarm rate of about 1e-6 or less (|z| < 5 standard errors; Kolmogorov–Smirnov
p > 1e-6; correlations below 4.5/√n, 7e-6), while a sampler with the wrong scale, a heavy or
missing tail, or correlated values fails for sure at these sizes.

The engine's noise is observed through :func:`zero_gradient_model`: every gradient is 0,
so each update of :func:`noise_updates` is exactly -lr · noise / expected batch.
"""

import numpy as np
from scipy import stats

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private

FALSE_ALARM = 1e-6
_LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
_BATCH = 16


def zero_gradient_model(noise="gaussian", insecure_dp_seed=None, native=True):
    """Two bias-free Dense layers (50→40→30, 3200 weights), private with sampler ``noise``
    (drawn by the native op if ``native`` and built, else TF's ops): on all-zero inputs every
    gradient is 0, so an update is noise."""
    model = keras.Sequential([keras.Input((50,)), keras.layers.Dense(40, use_bias=False),
                              keras.layers.Dense(30, use_bias=False)])
    return make_private(model, options=EngineOptions(noise=noise, native=native),
                        insecure_dp_seed=insecure_dp_seed)


def noise_updates(model, *, clip, sigma, steps, expected_batch=10.0):
    """The update of each of ``steps`` steps (learning rate 1) on a Poisson-structured zero
    batch, per variable, each from all-zero weights (so it is exactly -noise / expected
    batch). Separate fit calls: the noise counter must carry on across them."""
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=sigma,
                                                learning_rate=1.0), loss=_LOSS)
    weights = {"mask": tf.ones([_BATCH]), "expected_batch_size": tf.constant(expected_batch)}
    batch = tf.data.Dataset.from_tensors((tf.zeros([_BATCH, 50]), tf.zeros([_BATCH]), weights))
    updates = []
    for _ in range(steps):
        model.set_weights([np.zeros_like(w) for w in model.get_weights()])
        model.fit(batch, verbose=0)
        updates.append(model.get_weights())
    return updates


def _corr(a, b):
    return abs(np.corrcoef(a, b)[0, 1])


def assert_gaussian_draw(draw, std):
    """A 1-D draw of N(0, std²): KS, mean, std, kurtosis, the mass beyond 3σ (0.0027),
    and its two halves (which share Box–Muller pairs) and its neighbours uncorrelated."""
    assert np.all(np.isfinite(draw))
    assert stats.kstest(draw / std, "norm").pvalue > FALSE_ALARM
    n = len(draw)
    assert abs(draw.mean()) < 5 * std / np.sqrt(n)
    assert abs(draw.std() / std - 1) < 5 * np.sqrt(0.5 / n)
    assert abs(stats.kurtosis(draw)) < 5 * np.sqrt(24 / n)
    tail = np.mean(np.abs(draw) > 3.0 * std)  # P(|z| > 3) = 0.0027
    assert abs(tail - 0.0027) < 5 * np.sqrt(0.0027 / n)
    half = n // 2
    assert _corr(draw[:half], draw[half + 1:2 * half + 1]) < 5 / np.sqrt(half)
    assert _corr(draw[:-1], draw[1:]) < 5 / np.sqrt(n - 1)


def assert_noise_updates(updates, std):
    """``updates``: per step, the update of each variable of a model whose gradient is zero,
    so the update is the noise: N(0, std²) (std = lr·σ·C / expected batch), independent across
    steps, across variables, between neighbouring coordinates and between the coordinates
    i and i + n/2 that share Box–Muller pairs."""
    flat = [np.concatenate([u.ravel() for u in step]) for step in updates]
    pooled = np.concatenate(flat)
    # The SE of a sample std is ≈ std / sqrt(2n).
    assert abs(pooled.std() / std - 1) < 5 / np.sqrt(2 * pooled.size)
    assert abs(pooled.mean()) < 5 * std / np.sqrt(pooled.size)
    # A frozen cdf: SciPy's args= path is unreliable.
    assert stats.kstest(pooled, stats.norm(0.0, std).cdf).pvalue > FALSE_ALARM
    n, half = flat[0].size, flat[0].size // 2
    assert _corr(flat[0], flat[1]) < 4.5 / np.sqrt(n)
    kernel1, kernel2 = updates[0][0].ravel(), updates[0][1].ravel()
    assert _corr(kernel1[:kernel2.size], kernel2) < 4.5 / np.sqrt(kernel2.size)
    assert _corr(flat[0][:-1], flat[0][1:]) < 4.5 / np.sqrt(n - 1)
    assert _corr(flat[0][:half], flat[0][half:2 * half]) < 4.5 / np.sqrt(half)
