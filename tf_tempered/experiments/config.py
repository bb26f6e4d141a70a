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
"""The run config of the experiment scripts: :class:`TrainConfig`, its choices and its error.

A leaf of ``tf_tempered.experiments``: the recipes, the validation (common.py) and every
script import it; it imports none of them.
"""

import dataclasses

from tf_tempered import data as data_lib
from tf_tempered.privacy import accounting

__all__ = ["ACCOUNTANTS", "ACTIVATIONS", "ConfigError", "DATASETS", "DEFAULT_NOISE_MULTIPLIER",
           "FEATURES", "FEATURE_NORMS", "HEADS", "LR_SCHEDULES", "OPTIMIZERS", "SAMPLINGS",
           "TEMPERED_DEFAULTS", "TrainConfig"]

DATASETS = data_lib.NAMES
ACTIVATIONS = ("relu", "tanh", "tempered_sigmoid")
OPTIMIZERS = ("sgd", "adam")
FEATURES = ("pixels", "scatternet")
HEADS = ("cnn", "linear")
LR_SCHEDULES = ("constant", "cosine")
SAMPLINGS = accounting.SAMPLINGS
ACCOUNTANTS = accounting.ACCOUNTANTS
# TF Privacy's MNIST tutorial; used when neither noise_multiplier nor target_epsilon is given.
DEFAULT_NOISE_MULTIPLIER = 1.1
FEATURE_NORMS = ("group", "dp_stats", "none")
FEATURE_STORAGES = ("float16", "log8")  # tf_tempered.scatternet.codes.STORAGES
# The tempered sigmoid's flags: set to anything else only with --activation=tempered_sigmoid.
TEMPERED_DEFAULTS = {"scale": 2.0, "inverse_temperature": 2.0, "offset": 1.0,
                     "learnable": False}


class ConfigError(ValueError):
    """An invalid setting or combination; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Every setting of one training run; field names are the train script's flag names.

    ``noise_multiplier=None`` means 1.1, unless ``target_epsilon`` is given (then σ is
    calibrated to it). ``microbatches=None`` means one example per microbatch.
    ``output_dir=None`` writes no files. ``seed`` controls weight initialisation,
    dropout, the shuffling of non-private runs and data subsets, never the DP noise,
    Poisson batches or DP shuffling (secret); ``insecure_dp_seed`` makes those
    reproducible, and the run NOT private.
    """

    dataset: str = "mnist"
    data_dir: str = None
    features: str = "pixels"
    head: str = "cnn"
    norm_groups: int = 27
    feature_power: float = 1.0
    feature_storage: str = "float16"
    weight_standardization: bool = False
    feature_norm: str = "group"
    feature_norm_noise: float = 8.0
    feature_norm_mean_clip: float = 0.3
    feature_norm_square_clip: float = 0.15
    num_train: int = None
    num_test: int = None
    validation_size: int = 0
    validation_fold: int = None
    activation: str = "tempered_sigmoid"
    scale: float = 2.0
    inverse_temperature: float = 2.0
    offset: float = 1.0
    learnable: bool = False
    dpsgd: bool = True
    optimizer: str = "sgd"
    learning_rate: float = 0.15
    lr_schedule: str = "constant"
    momentum: float = 0.0
    l2_norm_clip: float = 1.0
    noise_multiplier: float = None
    target_epsilon: float = None
    batch_size: int = 256
    microbatches: int = None
    epochs: int = 60
    ema_decay: float = None
    sampling: str = accounting.DEFAULT_SAMPLING
    poisson_padding: bool = True
    accountant: str = accounting.DEFAULT_ACCOUNTANT
    delta: float = accounting.DEFAULT_DELTA
    seed: int = 0
    insecure_dp_seed: int = None
    augmult: int = 1
    augment_shift: int = 2
    augment_flip: bool = False
    output_dir: str = None
    save_model: bool = True
    recipe: str = None

    def replace(self, **changes):
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)
