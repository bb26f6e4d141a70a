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
"""Per-channel mean and variance of training features, released with differential privacy.

Tramèr & Boneh (ICLR 2021) normalize ScatterNet features with the training set's
per-channel mean and variance, estimated privately. For features ``x`` of shape
(N, H, W, C), example i contributes its per-channel spatial means ``m_i`` and mean
squares ``s_i`` (vectors of C), each clipped to an L2 norm (``mean_clip``,
``square_clip``); two Gaussian mechanisms release

    mean    = (Σ_i clip(m_i) + N(0, (σ·mean_clip)² I)) / N
    sq_mean = (Σ_i clip(s_i) + N(0, (σ·square_clip)² I)) / N
    var     = max(sq_mean − mean², 0)

Adding or removing one example moves each sum by at most its clip norm, so each release
is a Gaussian mechanism of noise multiplier σ on the whole dataset (no subsampling):
:func:`release_event` is their dp_accounting event, to be composed with DP-SGD's
(``prior_events`` of :mod:`tf_tempered.privacy.accounting`). N, the number of training
examples, is treated as public, as everywhere in DP-SGD's accounting.

The clip norms must not be read off the private data (Tramèr & Boneh take the data's
median norm, a leak): they are hyperparameters like DP-SGD's C. The defaults, 0.3 and
0.15, are the median norms of ``m_i`` and ``s_i`` on Fashion-MNIST's ScatterNet features
(J=2, L=8), i.e. set from public data when the private data is MNIST; for other data,
choose them on a validation split or from public data of the same kind.

The noise comes from the operating system's entropy (never from a public seed);
``insecure_dp_seed`` makes it reproducible, for tests only (the ε then does not hold).
"""

import dataclasses

import dp_accounting
import numpy as np

from tf_tempered.privacy import randomness

__all__ = ["DEFAULT_MEAN_CLIP", "DEFAULT_SQUARE_CLIP", "ChannelStats", "channel_moments",
           "clip_rows", "release_event", "dp_channel_stats"]

DEFAULT_MEAN_CLIP = 0.3
DEFAULT_SQUARE_CLIP = 0.15


@dataclasses.dataclass(frozen=True)
class ChannelStats:
    """Released per-channel ``mean`` and ``variance`` (C,) and the release's DpEvent."""

    mean: np.ndarray
    variance: np.ndarray
    noise_multiplier: float
    event: object


def channel_moments(features):
    """Per-example per-channel spatial means and mean squares: two arrays (N, C).

    >>> m, s = channel_moments(np.arange(8.0).reshape(2, 2, 1, 2))
    >>> m.tolist(), s.tolist()
    ([[1.0, 2.0], [5.0, 6.0]], [[2.0, 5.0], [26.0, 37.0]])
    """
    x = np.asarray(features, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"features must have shape (N, ..., C), got shape {x.shape}.")
    flat = x.reshape(x.shape[0], -1, x.shape[-1])
    return flat.mean(axis=1), (flat ** 2).mean(axis=1)


def clip_rows(rows, clip):
    """Each row scaled to L2 norm ``min(‖row‖, clip)``; a row with a non-finite entry
    contributes zeros (as the DP step drops such an example: an inf · 0 would be a NaN in
    the release, revealing the row with certainty).

    >>> clip_rows(np.array([[3.0, 4.0], [0.3, 0.4], [np.inf, 0.0]]), 1.0).tolist()
    [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]
    """
    finite = np.all(np.isfinite(rows), axis=1, keepdims=True)
    rows = np.where(finite, rows, 0.0)
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


def release_event(noise_multiplier):
    """The dp_accounting event of one release: two Gaussian mechanisms of multiplier σ."""
    return dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(noise_multiplier),
                                          dp_accounting.GaussianDpEvent(noise_multiplier)])


def _check_positive(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)) \
            or not 0 < value < np.inf:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}; e.g. "
                         f"{name}=8.0 for the noise or a clip norm such as 0.3.")
    return float(value)


def dp_channel_stats(features, *, noise_multiplier, mean_clip=DEFAULT_MEAN_CLIP,
                     square_clip=DEFAULT_SQUARE_CLIP, insecure_dp_seed=None):
    """The released per-channel mean and variance of ``features`` (N, ..., C) (module doc).

    >>> x = np.ones((1000, 2, 2, 3)) * [0.1, 0.2, 0.0]
    >>> stats = dp_channel_stats(x, noise_multiplier=8.0, insecure_dp_seed=0)
    >>> np.round(stats.mean, 2).tolist()
    [0.1, 0.2, 0.0]
    """
    sigma = _check_positive("noise_multiplier", noise_multiplier)
    mean_clip = _check_positive("mean_clip", mean_clip)
    square_clip = _check_positive("square_clip", square_clip)
    m, s = channel_moments(features)
    n = m.shape[0]
    if n == 0:
        raise ValueError("features holds no example; the statistics need training data.")
    seed = randomness.dp_seed("feature_stats", insecure_dp_seed=insecure_dp_seed)
    rng = np.random.default_rng(seed)
    mean = (clip_rows(m, mean_clip).sum(0) + rng.normal(0.0, sigma * mean_clip, m.shape[1])) / n
    sq_mean = (clip_rows(s, square_clip).sum(0)
               + rng.normal(0.0, sigma * square_clip, s.shape[1])) / n
    variance = np.maximum(sq_mean - mean ** 2, 0.0)
    return ChannelStats(mean=mean.astype(np.float32), variance=variance.astype(np.float32),
                        noise_multiplier=sigma, event=release_event(sigma))
