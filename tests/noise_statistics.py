# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Statistical checks of DP noise, shared by the sampler tests and the engine's.

The draws are secret (not seeded), so every check can fail by chance: each is set for a
false alarm rate of about 1e-6 or less (|z| < 5 standard errors; Kolmogorov–Smirnov
p > 1e-6; correlations below 4.5/√n, 7e-6), while a sampler with the wrong scale, a heavy or
missing tail, or correlated values fails for sure at these sizes.
"""

import numpy as np
from scipy import stats

FALSE_ALARM = 1e-6


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
