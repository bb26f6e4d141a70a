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
"""Differentially private training: fast DP-SGD engine, accounting, sampling."""

from tf_tempered.privacy.accounting import (compute_epsilon, make_dp_event,
                                            noise_multiplier_for_epsilon, num_steps)
from tf_tempered.privacy.data_sampling import shuffled_batches
from tf_tempered.privacy.errors import (InsecureDPRandomnessWarning, NotPrivateError,
                                        UnsupportedLayerError)
from tf_tempered.privacy.fit import epsilon_spent
from tf_tempered.privacy.gradients import DPGradients
from tf_tempered.privacy.layer_report import layer_paths
from tf_tempered.privacy.make_private import has_secret_dp_randomness, is_private, make_private
from tf_tempered.privacy import save_guard as _save_guard  # noqa: F401  (installs the save check)
from tf_tempered.privacy import weight_files as _weight_files  # noqa: F401  (weights files' DP)
from tf_tempered.privacy import plain_backups as _plain_backups  # noqa: F401  (BackupAndRestore)
from tf_tempered.privacy import model_files as _model_files  # noqa: F401  (model.save DP)
from tf_tempered.privacy.options import EngineOptions
from tf_tempered.privacy.settings import DPConfig, dp_config
from tf_tempered.privacy.optimizers import (DPKerasAdagradOptimizer, DPKerasAdamOptimizer,
                                            DPKerasSGDOptimizer)
from tf_tempered.privacy.sampling import (default_max_batch_size,
                                          distributed_poisson_batches, poisson_batches,
                                          poisson_steps_per_epoch)

# `tf_tempered.privacy.epsilon` (the CLI) is not imported here, so that
# `python -m tf_tempered.privacy.epsilon` runs it as a fresh module.
__all__ = [
    "DPConfig",
    "DPGradients",
    "DPKerasAdagradOptimizer",
    "DPKerasAdamOptimizer",
    "DPKerasSGDOptimizer",
    "EngineOptions",
    "InsecureDPRandomnessWarning",
    "NotPrivateError",
    "UnsupportedLayerError",
    "compute_epsilon",
    "default_max_batch_size",
    "dp_config",
    "epsilon_spent",
    "has_secret_dp_randomness",
    "is_private",
    "layer_paths",
    "make_dp_event",
    "make_private",
    "noise_multiplier_for_epsilon",
    "num_steps",
    "poisson_batches",
    "distributed_poisson_batches",
    "poisson_steps_per_epoch",
    "shuffled_batches",
]
