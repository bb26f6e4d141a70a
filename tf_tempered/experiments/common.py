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
"""The validation of a run config (:class:`TrainConfig`): one table of rules, read in order.

Their command lines (absl flags, --recipe, the entry point) are in command_line.py, the
config itself in config.py (re-exported here, with its choices: the module scripts use).

>>> config = validate_config(TrainConfig(dataset="digits", microbatches=7, sampling="shuffle"))
Traceback (most recent call last):
...
tf_tempered.experiments.config.ConfigError: --microbatches=7 does not divide --batch_size=256...
"""

import dataclasses
import math
import numbers
from typing import Callable, Tuple

from tf_tempered import feature_stats
from tf_tempered.experiments import recipes
from tf_tempered.experiments.config import (  # noqa: F401  (the scripts' API)
    ACCOUNTANTS, ACTIVATIONS, DATASETS, DEFAULT_NOISE_MULTIPLIER, FEATURE_NORMS, FEATURE_STORAGES,
    FEATURES, HEADS, LR_SCHEDULES, OPTIMIZERS, SAMPLINGS, TEMPERED_DEFAULTS, ConfigError,
    TrainConfig)

__all__ = ["ConfigError", "TrainConfig", "validate_config", "check_num_examples",
           "DEFAULT_NOISE_MULTIPLIER"]


def _fail(message):
    raise ConfigError(message)


def _is_number(value, integer=False):
    kind = numbers.Integral if integer else numbers.Real
    return isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)


@dataclasses.dataclass(frozen=True)
class Rule:
    """A check of a config: ``message(config)`` is the error when ``broken(config)``."""
    broken: Callable[[TrainConfig], bool]
    message: Callable[[TrainConfig], str]


def _choice(name, choices):
    return Rule(lambda c: getattr(c, name) not in choices,
                lambda c: f"--{name}={getattr(c, name)!r} is invalid: choose one of "
                          f"{', '.join(choices)}.")


def _positive(name, integer=False, optional=False, fix=True):
    kind = "a positive integer" if integer else "a positive finite number"
    return Rule(lambda c: not (optional and getattr(c, name) is None)
                and (not _is_number(getattr(c, name), integer) or getattr(c, name) <= 0),
                lambda c: f"--{name}={getattr(c, name)!r} is invalid: it must be {kind}."
                          + (f" Fix: e.g. --{name}={getattr(TrainConfig, name) or 1}."
                             if fix else ""))


def _integer(name, minimum=None, optional=True, why="", fix=""):
    """An integer (>= minimum if given); None allowed if optional."""
    at_least = "" if minimum is None else f" >= {minimum}"
    return Rule(lambda c: not (optional and getattr(c, name) is None) and (
        not _is_number(getattr(c, name), integer=True)
        or (minimum is not None and getattr(c, name) < minimum)),
        lambda c: f"--{name}={getattr(c, name)!r} is invalid: it must be an integer"
                  f"{at_least}{why}.{fix}")


def _between(name, low, high, closed_low=False, optional=False, fix=""):
    """A finite number in (low, high) ([low, high) if closed_low); None allowed if optional."""
    def broken(c):
        v = getattr(c, name)
        if optional and v is None:
            return False
        return not _is_number(v) or not ((low <= v) if closed_low else (low < v)) or v >= high
    interval = f"{'[' if closed_low else '('}{low:g}, {high:g})"
    return Rule(broken, lambda c: f"--{name}={getattr(c, name)!r} is invalid: it must be in "
                                  f"{interval}. Fix: {fix}")


def _changed_tempered_flag(c):
    return next((n for n, d in TEMPERED_DEFAULTS.items() if getattr(c, n) != d), None)


def _fashion_dp_stats_with_default_clips(c):
    # The defaults are Fashion-MNIST's own median norms: public for MNIST, a leak here.
    return (c.feature_norm == "dp_stats" and c.dataset == "fashion_mnist"
            and (c.feature_norm_mean_clip, c.feature_norm_square_clip)
            == (feature_stats.DEFAULT_MEAN_CLIP, feature_stats.DEFAULT_SQUARE_CLIP))


def _recipe_refused(c):
    try:
        recipes.recipe_flags(c.recipe, c.dataset)
    except ConfigError as error:
        return str(error)
    return None


_RULES: Tuple[Rule, ...] = (
    *(_choice(name, choices) for name, choices in (
        ("dataset", DATASETS), ("activation", ACTIVATIONS), ("optimizer", OPTIMIZERS),
        ("features", FEATURES), ("head", HEADS), ("lr_schedule", LR_SCHEDULES))),
    Rule(lambda c: c.head != "cnn" and c.features != "scatternet",
         lambda c: f"--head={c.head} applies to --features=scatternet only (the pixel models "
                   "are the paper's CNNs). Fix: add --features=scatternet, or drop --head."),
    Rule(lambda c: c.weight_standardization and (c.features != "scatternet" or c.head != "cnn"),
         lambda c: "--weight_standardization applies to the ScatterNet CNN's convolutions only "
                   f"(--features=scatternet --head=cnn), not --features={c.features} "
                   f"--head={c.head}. Fix: drop --weight_standardization, or use those flags."),
    Rule(lambda c: c.head == "linear" and c.learnable,
         lambda c: "--learnable has nothing to learn with --head=linear (no hidden layer, no "
                   "activation). Fix: drop --learnable, or use --head=cnn."),
    _positive("norm_groups", integer=True),
    _positive("feature_power"),
    Rule(lambda c: c.feature_power != 1 and c.features != "scatternet",
         lambda c: f"--feature_power={c.feature_power:g} applies to --features=scatternet only. "
                   "Fix: drop --feature_power, or add --features=scatternet."),
    Rule(lambda c: c.feature_power != 1 and c.feature_norm == "dp_stats",
         lambda c: f"--feature_power={c.feature_power:g} with --feature_norm=dp_stats: the "
                   "statistics are released on the features before the power. Fix: drop "
                   "--feature_power, or use --feature_norm=group."),
    _choice("feature_norm", FEATURE_NORMS),
    *(_positive(name, fix=False) for name in (
        "feature_norm_noise", "feature_norm_mean_clip", "feature_norm_square_clip")),
    Rule(lambda c: c.feature_norm != "group" and c.features != "scatternet",
         lambda c: f"--feature_norm={c.feature_norm} applies to --features=scatternet only. "
                   "Fix: drop --feature_norm, or add --features=scatternet."),
    Rule(lambda c: c.feature_norm == "dp_stats" and not c.dpsgd,
         lambda c: "--feature_norm=dp_stats releases statistics with DP noise, but --nodpsgd "
                   "trains without privacy. Fix: drop --nodpsgd, or use --feature_norm=group."),
    Rule(_fashion_dp_stats_with_default_clips,
         lambda c: "--feature_norm=dp_stats on --dataset=fashion_mnist with the default clip "
                   f"norms ({feature_stats.DEFAULT_MEAN_CLIP:g}, "
                   f"{feature_stats.DEFAULT_SQUARE_CLIP:g}) would use norms measured on "
                   "Fashion-MNIST itself (private data). Fix: pass --feature_norm_mean_clip and "
                   "--feature_norm_square_clip chosen without this data (e.g. from MNIST's "
                   "features), or use --feature_norm=group."),
    _choice("sampling", SAMPLINGS),
    _choice("accountant", ACCOUNTANTS),
    _positive("learning_rate"), _positive("l2_norm_clip"),
    _positive("batch_size", integer=True), _positive("epochs", integer=True),
    *(_positive(name, integer=True, optional=True)
      for name in ("num_train", "num_test", "microbatches")),
    _positive("augmult", integer=True),
    _between("momentum", 0, 1, closed_low=True, fix="e.g. --momentum=0.9, or 0 for plain SGD."),
    _choice("feature_storage", FEATURE_STORAGES),
    Rule(lambda c: c.feature_storage != "float16"
         and (c.features != "scatternet" or c.augmult == 1),
         lambda c: f"--feature_storage={c.feature_storage} stores the shifted copies' "
                   "ScatterNet features: it needs --features=scatternet and --augmult=K "
                   "(K > 1). Fix: drop --feature_storage, or add those flags."),
    Rule(lambda c: c.augment_flip and c.augmult == 1,
         lambda c: "--augment_flip has no effect without augmentation: give --augmult=K (K > 1), "
                   "or drop --augment_flip."),
    Rule(lambda c: c.momentum and c.optimizer != "sgd",
         lambda c: f"--momentum only applies to --optimizer=sgd, not --optimizer={c.optimizer}. "
                   "Fix: drop --momentum."),
    _integer("augment_shift", 0, optional=False, why=" (pixels)",
             fix=" Fix: e.g. --augment_shift=2."),
    _integer("validation_size", 0, optional=False, why=" (0: no validation split)",
             fix=" Fix: e.g. --validation_size=5000."),
    _integer("validation_fold", 0, why=" (block k of --validation_size examples from the start)",
             fix=" Fix: e.g. --validation_fold=0, or drop it (the last --validation_size "
                 "examples)."),
    Rule(lambda c: c.validation_fold is not None and not c.validation_size,
         lambda c: f"--validation_fold={c.validation_fold} needs --validation_size (the size of "
                   "each fold). Fix: e.g. --validation_size=12000 for 5 folds of MNIST's 60,000."),
    _positive("noise_multiplier", optional=True), _positive("target_epsilon", optional=True),
    _between("ema_decay", 0, 1, closed_low=True, optional=True,
             fix="e.g. --ema_decay=0.999, or 0 (no averaging)."),
    Rule(lambda c: c.activation == "tempered_sigmoid" and not (
        _is_number(c.scale) and c.scale > 0),
        lambda c: f"--scale={c.scale!r} is invalid: it must be a positive finite number. "
                  "Fix: e.g. --scale=2.0."),
    Rule(lambda c: c.activation == "tempered_sigmoid" and not (
        _is_number(c.inverse_temperature) and c.inverse_temperature > 0),
        lambda c: f"--inverse_temperature={c.inverse_temperature!r} is invalid: it must be a "
                  "positive finite number. Fix: e.g. --inverse_temperature=2.0."),
    Rule(lambda c: c.activation == "tempered_sigmoid" and not _is_number(c.offset),
         lambda c: f"--offset={c.offset!r} is invalid: it must be a finite number."),
    Rule(lambda c: c.activation != "tempered_sigmoid" and _changed_tempered_flag(c),
         lambda c: f"--{_changed_tempered_flag(c)} only applies to --activation=tempered_sigmoid, "
                   f"but --activation={c.activation}. Fix: drop --{_changed_tempered_flag(c)}, "
                   "or use --activation=tempered_sigmoid."),
    _between("delta", 0, 1, fix="e.g. --delta=1e-5 (below 1/number of training examples)."),
    Rule(lambda c: c.recipe is not None and _recipe_refused(c), _recipe_refused),
    _integer("seed"),
    _integer("insecure_dp_seed",
             fix=" Fix: drop it (secret DP randomness, the default)."),
    Rule(lambda c: c.noise_multiplier is not None and c.target_epsilon is not None,
         lambda c: f"--noise_multiplier={c.noise_multiplier} and --target_epsilon="
                   f"{c.target_epsilon} are mutually exclusive: --target_epsilon calibrates "
                   "the noise multiplier. Fix: give only one of them"
                   + (f" (--recipe={c.recipe} sets --target_epsilon: drop --noise_multiplier, "
                      "or drop --recipe and give its other flags yourself)."
                      if c.recipe is not None else ".")),
    *(Rule(lambda c, name=name: not c.dpsgd and getattr(c, name) is not None,
           lambda c, name=name: f"--{name} has no effect with --nodpsgd (non-private "
                                f"training). Fix: drop --{name}, or train with --dpsgd.")
      for name in ("noise_multiplier", "target_epsilon", "microbatches", "insecure_dp_seed")),
    Rule(lambda c: c.microbatches is not None and c.batch_size % c.microbatches,
         lambda c: f"--microbatches={c.microbatches} does not divide --batch_size="
                   f"{c.batch_size}; every microbatch must hold the same number of examples. "
                   f"Fix: use a divisor of {c.batch_size} (e.g. --microbatches={c.batch_size}) "
                   "or drop --microbatches."),
    Rule(lambda c: (c.microbatches is not None and c.sampling == "poisson"
                    and c.microbatches != c.batch_size),
         lambda c: f"--sampling=poisson needs one example per microbatch, but --microbatches="
                   f"{c.microbatches} with --batch_size={c.batch_size} puts "
                   f"{c.batch_size // c.microbatches} in each (Poisson batches vary in size). "
                   "Fix: drop --microbatches, or use --sampling=shuffle."),
    Rule(lambda c: not c.poisson_padding and not (c.dpsgd and c.sampling == "poisson"),
         lambda c: "--nopoisson_padding applies to DP-SGD's Poisson batches only. Fix: drop "
                   "it, or train with --dpsgd --sampling=poisson."),
)


def validate_config(config):
    """Checks every setting of ``config`` (a TrainConfig) and returns it; raises ConfigError
    with the first broken rule's message (it names the flag and the fix).

    Checks that need the dataset size are in :func:`check_num_examples`.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"expected a TrainConfig, got {type(config).__name__}.")
    for rule in _RULES:
        if rule.broken(config):
            _fail(rule.message(config))
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
