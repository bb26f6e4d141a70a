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
"""The privacy plan of one training run: steps per epoch, σ (calibrated or given) and ε.

Split from :mod:`tf_tempered.experiments.train`, which re-exports its names.
"""

import math
import warnings

from tf_tempered.experiments import common, feature_norm
from tf_tempered.privacy import accounting, randomness, sampling

__all__ = ["PrivacyPlan", "plan_privacy"]


class PrivacyPlan:
    """Steps, σ and the ε accounting of one run (``noise_multiplier=None``: non-private)."""

    def __init__(self, config, num_examples, steps_per_epoch, noise_multiplier):
        self.config = config
        self.num_examples = num_examples
        self.steps_per_epoch = steps_per_epoch
        self.total_steps = steps_per_epoch * config.epochs
        self.noise_multiplier = noise_multiplier
        self.microbatch_size = _microbatch_size(config)
        # Releases on the training data before DP-SGD (--feature_norm=dp_stats), composed
        # into every ε below.
        self.prior_events = feature_norm.prior_events(config) if noise_multiplier else ()
        # False for a DP run with --insecure_dp_seed (its noise and batches are public);
        # run_training confirms it from the model (has_secret_dp_randomness).
        self.epsilon_holds = noise_multiplier is None or config.insecure_dp_seed is None

    def _epsilon(self, steps):
        with warnings.catch_warnings():  # the shuffle note is said once, in the label
            warnings.filterwarnings("ignore", message="sampling='shuffle'", category=UserWarning)
            return accounting.compute_epsilon(
                num_examples=self.num_examples, batch_size=self.config.batch_size,
                noise_multiplier=self.noise_multiplier, steps=steps, delta=self.config.delta,
                sampling=self.config.sampling, accountant=self.config.accountant,
                microbatch_size=self.microbatch_size, prior_events=self.prior_events)

    def prior_epsilon(self):
        """ε of the releases before training alone (0 without any)."""
        return accounting.prior_epsilon(self.prior_events, delta=self.config.delta,
                                        accountant=self.config.accountant)

    def epsilon(self, steps):
        """ε after ``steps`` steps of the run's sampling: Poisson (amplified), or the bound
        for shuffled batches (without amplification) with --sampling=shuffle."""
        if self.noise_multiplier is None:
            return math.inf
        return self._epsilon(steps) if steps else self.prior_epsilon()

    def dp_randomness(self):
        """"secret", "insecure" (--insecure_dp_seed) or None (non-private)."""
        if self.noise_multiplier is None:
            return None
        return "secret" if self.epsilon_holds else "insecure"

    def label(self):
        """What the reported ε means, in words."""
        c = self.config
        if self.noise_multiplier is None:
            return "non-private training: ε = inf"
        where = (f"at δ={c.delta:g}, {c.accountant.upper()} accountant, σ="
                 f"{self.noise_multiplier:.4g}, q={c.batch_size / self.num_examples:.4g}")
        if c.sampling == "poisson":
            label = f"ε {where}, Poisson sampling (as trained)"
        else:
            label = (f"ε {where}, shuffled fixed-size batches (as trained): the bound "
                     f"proven for them, without amplification by subsampling (one Gaussian "
                     f"mechanism per epoch)")
        if self.prior_events:
            label += (f", composed with the DP feature statistics (--feature_norm=dp_stats, "
                      f"noise {c.feature_norm_noise:g}, ε alone {self.prior_epsilon():.3g})")
        if not self.epsilon_holds:
            label += (f"; NOT PRIVATE: --insecure_dp_seed={c.insecure_dp_seed}, "
                      f"{randomness.INSECURE_NOTE}")
        return label


def _microbatch_size(config):
    """Examples per microbatch (accounting doubles the sensitivity above one)."""
    return config.batch_size // (config.microbatches or config.batch_size)


def plan_privacy(config, num_examples):
    """The PrivacyPlan of ``config`` on ``num_examples`` examples (calibrates σ if asked)."""
    if not config.dpsgd or config.sampling == "shuffle":
        steps_per_epoch = num_examples // config.batch_size  # drop_remainder batches
    else:
        steps_per_epoch = sampling.poisson_steps_per_epoch(
            num_examples=num_examples, expected_batch_size=config.batch_size)
    if not config.dpsgd:
        return PrivacyPlan(config, num_examples, steps_per_epoch, None)
    sigma = config.noise_multiplier
    if config.target_epsilon is not None:
        try:
            sigma = accounting.noise_multiplier_for_epsilon(
                target_epsilon=config.target_epsilon, num_examples=num_examples,
                batch_size=config.batch_size, steps=steps_per_epoch * config.epochs,
                delta=config.delta, sampling=config.sampling, accountant=config.accountant,
                microbatch_size=_microbatch_size(config),
                prior_events=feature_norm.prior_events(config))
        except ValueError as e:
            raise common.ConfigError(f"--target_epsilon={config.target_epsilon}: {e}") from e
    elif sigma is None:
        sigma = common.DEFAULT_NOISE_MULTIPLIER
    return PrivacyPlan(config, num_examples, steps_per_epoch, float(sigma))
