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
* ``none``: no normalization (for ablations).
"""

from tf_tempered import feature_stats

__all__ = ["FEATURE_NORMS", "VARIANCE_EPSILON", "check_config", "prior_events", "release"]

FEATURE_NORMS = ("group", "dp_stats", "none")
VARIANCE_EPSILON = 1e-5  # as BatchNorm's: channels whose released variance is ~0 stay bounded


def check_config(config, fail):
    """Calls ``fail(message)`` for a --feature_norm setting that cannot apply."""
    if config.feature_norm not in FEATURE_NORMS:
        fail(f"--feature_norm={config.feature_norm!r} is invalid: choose one of "
             f"{', '.join(FEATURE_NORMS)}.")
    for name in ("feature_norm_noise", "feature_norm_mean_clip", "feature_norm_square_clip"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < \
                float("inf"):
            fail(f"--{name}={value!r} is invalid: it must be a positive finite number.")
    if config.feature_norm != "group" and config.features != "scatternet":
        fail(f"--feature_norm={config.feature_norm} applies to --features=scatternet only. "
             "Fix: drop --feature_norm, or add --features=scatternet.")
    if config.feature_norm == "dp_stats" and not config.dpsgd:
        fail("--feature_norm=dp_stats releases statistics with DP noise, but --nodpsgd trains "
             "without privacy. Fix: drop --nodpsgd, or use --feature_norm=group.")


def prior_events(config):
    """DpEvents spent on the training data before DP-SGD: () or the statistics' release."""
    if config.dpsgd and config.features == "scatternet" and config.feature_norm == "dp_stats":
        return (feature_stats.release_event(config.feature_norm_noise),)
    return ()


def release(config, x_train):
    """The released statistics (ChannelStats) for ``dp_stats``, else None. Call once per run."""
    if not prior_events(config):
        return None
    return feature_stats.dp_channel_stats(
        x_train, noise_multiplier=config.feature_norm_noise,
        mean_clip=config.feature_norm_mean_clip, square_clip=config.feature_norm_square_clip,
        insecure_dp_seed=config.insecure_dp_seed)
