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
"""``--feature_norm``: how the ScatterNet CNN normalizes its input features.

* ``group`` (default): GroupNorm with ``--norm_groups`` groups, no affine parameters.
  Each example is normalized by its own statistics: data-independent, no privacy cost.
* ``dp_stats``: Tramèr & Boneh's "BN" input normalization: (x − mean) / sqrt(var + 1e-5)
  with the training set's per-channel mean and variance released with DP
  (:mod:`tf_tempered.feature_stats`, noise ``--feature_norm_noise``, clip norms
  ``--feature_norm_mean_clip`` / ``--feature_norm_square_clip``), ONCE per run, on the
  training part only. Its two Gaussian mechanisms are composed with DP-SGD in every ε the
  run reports, and ``--target_epsilon`` calibrates DP-SGD's σ for the budget left.
  With ``--backup_dir`` the release is stored there (``feature_stats.npz``) and a resumed
  run reuses it: the stats are constants of the model, not weights that
  BackupAndRestore restores, so releasing again would spend (and use) a second release
  that ε does not count.
* ``none``: no normalization (for ablations).
"""

import os
import pathlib

import numpy as np

from tf_tempered import feature_stats

__all__ = ["VARIANCE_EPSILON", "STORE_NAME", "moment_points", "prior_events", "release"]

VARIANCE_EPSILON = 1e-5  # as BatchNorm's: channels whose released variance is ~0 stay bounded
STORE_NAME = "feature_stats.npz"  # the release, in --backup_dir


def prior_events(config):
    """DpEvents spent on the training data before DP-SGD: () or the statistics' release."""
    if config.dpsgd and config.features == "scatternet" and config.feature_norm == "dp_stats":
        return (feature_stats.release_event(config.feature_norm_noise),)
    return ()


def release(config, x_train, store=None):
    """The released statistics (ChannelStats) for ``dp_stats``, else None. Call once per run.

    ``store`` (a file path, e.g. ``<backup_dir>/feature_stats.npz``): if it exists, the
    release stored there by an earlier start of the same run is returned (no new
    release); else the new release is written there (atomically) before training.
    """
    if not prior_events(config):
        return None
    setting = {"noise_multiplier": float(config.feature_norm_noise),
               "mean_clip": float(config.feature_norm_mean_clip),
               "square_clip": float(config.feature_norm_square_clip),
               "num_examples": int(len(x_train)), "channels": int(np.shape(x_train)[-1])}
    store = None if store is None else pathlib.Path(store)
    if store is not None and store.exists():
        return _load(store, setting)
    stats = feature_stats.dp_channel_stats(
        moment_points(x_train), noise_multiplier=config.feature_norm_noise,
        mean_clip=config.feature_norm_mean_clip, square_clip=config.feature_norm_square_clip,
        insecure_dp_seed=config.insecure_dp_seed)
    if store is not None:
        store.parent.mkdir(parents=True, exist_ok=True)
        tmp = store.with_name(store.name + ".tmp")
        with open(tmp, "wb") as f:  # a file object: np.savez adds no suffix
            np.savez(f, mean=stats.mean, variance=stats.variance, **setting)
        os.replace(tmp, store)  # atomic: a kill leaves no half-written release
    return stats


def moment_points(features, chunk=4096):
    """[N, 2, C] float64: per example, the two points m ± sqrt(s − m²) of its channels.

    m and s are the example's per-channel spatial mean and mean square
    (:func:`tf_tempered.feature_stats.channel_moments`, computed ``chunk`` examples at a
    time); the two points have that same mean and mean square (to float64 rounding, ~1e-16
    relative), so :func:`~tf_tempered.feature_stats.dp_channel_stats` releases from them
    what it releases from the features themselves (each example's pair depends on that
    example alone: the clipping, sensitivity and noise are the same), without its float64
    copy of every feature and of their squares: 2 values per example and channel
    instead of 2 per feature (sizes for MNIST: docs/reproduction.md, "What a run takes").

    >>> m, s = feature_stats.channel_moments(moment_points(np.arange(8.0).reshape(2, 2, 1, 2)))
    >>> m.tolist(), s.tolist()
    ([[1.0, 2.0], [5.0, 6.0]], [[2.0, 5.0], [26.0, 37.0]])
    """
    n = len(features)
    points = np.empty((n, 2, np.shape(features)[-1]), np.float64)
    for start in range(0, n, chunk):
        m, s = feature_stats.channel_moments(features[start:start + chunk])
        spread = np.sqrt(np.maximum(s - m * m, 0.0))
        points[start:start + len(m), 0] = m + spread
        points[start:start + len(m), 1] = m - spread
    return points


def _load(store, setting):
    """The release stored in ``store``; ValueError if it was made with another setting."""
    with np.load(store) as saved:
        stored = {k: saved[k].item() for k in setting}
        mean, variance = saved["mean"], saved["variance"]
    if stored != setting:
        raise ValueError(f"{store} holds DP feature statistics released with {stored}, but "
                         f"this run asks for {setting}. Fix: resume with the same flags, or "
                         f"start the run with a new --backup_dir.")
    return feature_stats.ChannelStats(
        mean=mean, variance=variance, noise_multiplier=setting["noise_multiplier"],
        event=feature_stats.release_event(setting["noise_multiplier"]))
