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
"""What the experiment scripts share: the run config and its validation.

Their command lines (absl flags, --recipe, the entry point) are in command_line.py.

>>> config = validate_config(TrainConfig(dataset="digits", microbatches=7, sampling="shuffle"))
Traceback (most recent call last):
...
tf_tempered.experiments.common.ConfigError: --microbatches=7 does not divide --batch_size=256...
"""

import dataclasses
import math
import numbers

from tf_tempered import data as data_lib
from tf_tempered.privacy import accounting

__all__ = ["ConfigError", "TrainConfig", "validate_config", "check_num_examples",
           "DEFAULT_NOISE_MULTIPLIER"]

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
_TEMPERED_DEFAULTS = {"scale": 2.0, "inverse_temperature": 2.0, "offset": 1.0,
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


def _fail(message):
    raise ConfigError(message)


def _is_number(value, integer=False):
    kind = numbers.Integral if integer else numbers.Real
    return isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)


def _check_positive(config, name, integer=False, optional=False):
    value = getattr(config, name)
    if value is None and optional:
        return
    if not _is_number(value, integer) or value <= 0:
        kind = "a positive integer" if integer else "a positive finite number"
        _fail(f"--{name}={value!r} is invalid: it must be {kind}. Fix: e.g. "
              f"--{name}={getattr(TrainConfig, name) or 1}.")


def _check_choice(config, name, choices):
    value = getattr(config, name)
    if value not in choices:
        _fail(f"--{name}={value!r} is invalid: choose one of {', '.join(choices)}.")


def validate_config(config):
    """Checks every setting of ``config`` (a TrainConfig) and returns it; raises ConfigError.

    Checks that need the dataset size are in :func:`check_num_examples`.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"expected a TrainConfig, got {type(config).__name__}.")
    _check_choice(config, "dataset", DATASETS)
    _check_choice(config, "activation", ACTIVATIONS)
    _check_choice(config, "optimizer", OPTIMIZERS)
    _check_choice(config, "features", FEATURES)
    _check_choice(config, "head", HEADS)
    _check_choice(config, "lr_schedule", LR_SCHEDULES)
    if config.head != "cnn" and config.features != "scatternet":
        _fail(f"--head={config.head} applies to --features=scatternet only (the pixel models "
              "are the paper's CNNs). Fix: add --features=scatternet, or drop --head.")
    if config.weight_standardization and (config.features != "scatternet"
                                          or config.head != "cnn"):
        _fail("--weight_standardization applies to the ScatterNet CNN's convolutions only "
              f"(--features=scatternet --head=cnn), not --features={config.features} "
              f"--head={config.head}. Fix: drop --weight_standardization, or use those flags.")
    if config.head == "linear" and config.learnable:
        _fail("--learnable has nothing to learn with --head=linear (no hidden layer, no "
              "activation). Fix: drop --learnable, or use --head=cnn.")
    _check_positive(config, "norm_groups", integer=True)
    from tf_tempered.experiments import feature_norm  # pylint: disable=g-import-not-at-top
    feature_norm.check_config(config, _fail)
    _check_choice(config, "sampling", SAMPLINGS)
    _check_choice(config, "accountant", ACCOUNTANTS)
    for name in ("learning_rate", "l2_norm_clip"):
        _check_positive(config, name)
    for name in ("batch_size", "epochs"):
        _check_positive(config, name, integer=True)
    for name in ("num_train", "num_test", "microbatches"):
        _check_positive(config, name, integer=True, optional=True)
    _check_positive(config, "augmult", integer=True)
    if not _is_number(config.momentum) or not 0 <= config.momentum < 1:
        _fail(f"--momentum={config.momentum!r} is invalid: it must be in [0, 1). Fix: e.g. "
              "--momentum=0.9, or 0 for plain SGD.")
    if config.augment_flip and config.augmult == 1:
        _fail("--augment_flip has no effect without augmentation: give --augmult=K (K > 1), "
              "or drop --augment_flip.")
    if config.augment_flip and config.features == "scatternet":
        # The oriented wavelets' channels would have to be permuted too.
        _fail("--augment_flip is not supported with --features=scatternet (its copies are "
              "precomputed features of shifted images). Fix: drop --augment_flip, or use "
              "--features=pixels.")
    if config.momentum and config.optimizer != "sgd":
        _fail(f"--momentum only applies to --optimizer=sgd, not --optimizer={config.optimizer}. "
              "Fix: drop --momentum.")
    if not _is_number(config.augment_shift, integer=True) or config.augment_shift < 0:
        _fail(f"--augment_shift={config.augment_shift!r} is invalid: it must be an integer "
              ">= 0 (pixels). Fix: e.g. --augment_shift=2.")
    if not _is_number(config.validation_size, integer=True) or config.validation_size < 0:
        _fail(f"--validation_size={config.validation_size!r} is invalid: it must be a "
              "non-negative integer (0: no validation split). Fix: e.g. --validation_size=5000.")
    if config.validation_fold is not None:
        if not _is_number(config.validation_fold, integer=True) or config.validation_fold < 0:
            _fail(f"--validation_fold={config.validation_fold!r} is invalid: it must be an "
                  "integer >= 0 (block k of --validation_size examples from the start). Fix: "
                  "e.g. --validation_fold=0, or drop it (the last --validation_size examples).")
        if not config.validation_size:
            _fail(f"--validation_fold={config.validation_fold} needs --validation_size (the "
                  "size of each fold). Fix: e.g. --validation_size=12000 for 5 folds of "
                  "MNIST's 60,000.")
    for name in ("noise_multiplier", "target_epsilon"):
        _check_positive(config, name, optional=True)
    if config.ema_decay is not None and not (_is_number(config.ema_decay)
                                             and 0 < config.ema_decay < 1):
        _fail(f"--ema_decay={config.ema_decay!r} is invalid: it must be in (0, 1). Fix: e.g. "
              "--ema_decay=0.999, or drop it (no averaging).")
    if config.activation == "tempered_sigmoid":
        for name in ("scale", "inverse_temperature"):
            _check_positive(config, name)
        if not _is_number(config.offset):
            _fail(f"--offset={config.offset!r} is invalid: it must be a finite number.")
    else:
        changed = [n for n, d in _TEMPERED_DEFAULTS.items() if getattr(config, n) != d]
        if changed:
            _fail(f"--{changed[0]} only applies to --activation=tempered_sigmoid, but "
                  f"--activation={config.activation}. Fix: drop --{changed[0]}, or use "
                  "--activation=tempered_sigmoid.")
    if not _is_number(config.delta) or not 0 < config.delta < 1:
        _fail(f"--delta={config.delta!r} is invalid: it must be in (0, 1). Fix: e.g. "
              "--delta=1e-5 (below 1/number of training examples).")
    if config.recipe is not None:
        from tf_tempered.experiments import recipes  # pylint: disable=g-import-not-at-top
        recipes.recipe_flags(config.recipe, config.dataset)  # refuses unknown names
    if config.seed is not None and not _is_number(config.seed, integer=True):
        _fail(f"--seed={config.seed!r} is invalid: it must be an integer.")
    if config.insecure_dp_seed is not None and not _is_number(config.insecure_dp_seed,
                                                              integer=True):
        _fail(f"--insecure_dp_seed={config.insecure_dp_seed!r} is invalid: it must be an "
              "integer. Fix: drop it (secret DP randomness, the default).")
    if config.noise_multiplier is not None and config.target_epsilon is not None:
        _fail(f"--noise_multiplier={config.noise_multiplier} and --target_epsilon="
              f"{config.target_epsilon} are mutually exclusive: --target_epsilon calibrates "
              "the noise multiplier. Fix: give only one of them.")
    if not config.dpsgd:
        for name in ("noise_multiplier", "target_epsilon", "microbatches", "insecure_dp_seed"):
            if getattr(config, name) is not None:
                _fail(f"--{name} has no effect with --nodpsgd (non-private training). Fix: "
                      f"drop --{name}, or train with --dpsgd.")
    if config.microbatches is not None:
        if config.batch_size % config.microbatches:
            _fail(f"--microbatches={config.microbatches} does not divide --batch_size="
                  f"{config.batch_size}; every microbatch must hold the same number of "
                  f"examples. Fix: use a divisor of {config.batch_size} (e.g. "
                  f"--microbatches={config.batch_size}) or drop --microbatches.")
        if config.sampling == "poisson" and config.microbatches != config.batch_size:
            _fail(f"--sampling=poisson needs one example per microbatch, but --microbatches="
                  f"{config.microbatches} with --batch_size={config.batch_size} puts "
                  f"{config.batch_size // config.microbatches} in each (Poisson batches vary "
                  "in size). Fix: drop --microbatches, or use --sampling=shuffle.")
    return config


def check_num_examples(config, num_examples):
    """Checks the settings that depend on the number of training examples.

    ``num_examples``: the training examples loaded, before the validation split.
    """
    if config.validation_size >= num_examples:
        _fail(f"--validation_size={config.validation_size} leaves no training examples: "
              f"--dataset={config.dataset} has {num_examples}"
              f"{f' (--num_train={config.num_train})' if config.num_train else ''}. Fix: use "
              f"--validation_size={num_examples // 10} or less.")
    fold = config.validation_fold
    if fold is not None and (fold + 1) * config.validation_size > num_examples:
        _fail(f"--validation_fold={fold} is past the end: {num_examples // config.validation_size}"
              f" folds of --validation_size={config.validation_size} fit in the "
              f"{num_examples} training examples of --dataset={config.dataset}. Fix: use "
              f"--validation_fold={num_examples // config.validation_size - 1} or less.")
    num_examples -= config.validation_size
    if num_examples < config.batch_size:
        held_out = config.validation_size
        _fail(f"--batch_size={config.batch_size} is larger than the {num_examples} training "
              f"examples of --dataset={config.dataset}"
              f"{f' (--num_train={config.num_train})' if config.num_train else ''}"
              f"{f' after --validation_size={held_out}' if held_out else ''}"
              f". Fix: use --batch_size={num_examples} or less, or more training data.")
