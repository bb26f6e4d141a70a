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
"""The experiment scripts' command lines: train flags, --recipe, the absl entry point.

Every script defines the train flags with :func:`define_training_flags` (from its
``main``, never at import time), reads them back into a :class:`TrainConfig` with
:func:`config_from_flags` (``--recipe`` fills the flags not given) and runs under
absl through :func:`absl_entry_point`, which turns a ConfigError into a usage error.
"""

import dataclasses
import math
import sys

from tf_tempered.experiments import malloc_arenas, recipes
from tf_tempered.experiments.common import (ACCOUNTANTS, ACTIVATIONS, DATASETS,
                                            DEFAULT_NOISE_MULTIPLIER, FEATURE_STORAGES, FEATURES,
                                            HEADS,
                                            LR_SCHEDULES, OPTIMIZERS, SAMPLINGS, ConfigError,
                                            TrainConfig)

__all__ = ["define_training_flags", "config_from_flags", "parse_floats", "absl_entry_point",
           "declare_main_module_flags"]


def _data_flags(d):
    """The dataset, its features and the validation split."""
    return [
        ("enum", "dataset", d.dataset, "Dataset.", DATASETS),
        ("string", "data_dir", None, "Folder with the dataset files (see tf_tempered.data)."),
        ("integer", "num_train", None, "Keep only the first so many training examples."),
        ("integer", "num_test", None, "Keep only the first so many test examples."),
        ("enum", "features", d.features, "Model inputs: pixels (the paper's CNNs) or "
                                         "scatternet (ScatterNet features, J=2, L=8, and "
                                         "Tramer & Boneh's CNN; needs kymatio).", FEATURES),
        ("enum", "head", d.head, "Model on the ScatterNet features: cnn (Tramer & Boneh's "
                                 "33k-parameter CNN) or linear (normalization, then one Dense "
                                 "layer: no hidden layer, so the activation flags do not "
                                 "apply).", HEADS),
        ("bool", "weight_standardization", d.weight_standardization,
         "ScatterNet CNN: scaled weight standardization of its convolutions "
         "(tf_tempered.WeightStandardizedConv2D(scaled=True): each output channel's kernel "
         "centred and scaled to variance 1/fan-in on every call)."),
        ("integer", "norm_groups", d.norm_groups, "GroupNorm groups of the ScatterNet CNN's "
                                                  "input (must divide its 81 channels)."),
        ("float", "feature_power", d.feature_power,
         "ScatterNet features compressed as sign(x)*|x|^p before their normalization "
         "(tf_tempered.scatternet.FeaturePower; 1: unchanged, 0.5: square root). A fixed "
         "function of each example: no privacy cost."),
        ("enum", "feature_norm", d.feature_norm, "ScatterNet input normalization: group "
         "(GroupNorm, no privacy cost), dp_stats (per-channel mean/variance released with DP, "
         "composed into ε) or none. See tf_tempered/experiments/feature_norm.py.",
         ("group", "dp_stats", "none")),
        ("float", "feature_norm_noise", d.feature_norm_noise,
         "Noise multiplier of --feature_norm=dp_stats' two Gaussian releases."),
        ("float", "feature_norm_mean_clip", d.feature_norm_mean_clip,
         "L2 clip of each example's per-channel means (--feature_norm=dp_stats)."),
        ("float", "feature_norm_square_clip", d.feature_norm_square_clip,
         "L2 clip of each example's per-channel mean squares (--feature_norm=dp_stats)."),
        ("integer", "validation_size", d.validation_size,
         "Hold out the LAST so many training examples as a validation set (0: none). "
         "Training, σ and ε use the others only; per-epoch and final accuracy are then on "
         "the validation set, and the test set is evaluated once, at the end."),
        ("integer", "validation_fold", None,
         "With --validation_size=S: hold out examples [k*S, (k+1)*S) instead of the last S "
         "(k-fold cross-validation: S = N/K and k = 0..K-1, one run per fold)."),
    ]


def _model_flags(d):
    """The hidden activation."""
    return [
        ("enum", "activation", d.activation, "Activation of every hidden layer.", ACTIVATIONS),
        ("float", "scale", d.scale, "Tempered sigmoid scale s."),
        ("float", "inverse_temperature", d.inverse_temperature, "Tempered sigmoid T."),
        ("float", "offset", d.offset, "Tempered sigmoid offset o."),
        ("bool", "learnable", d.learnable, "Learn (s, T, o) per layer."),
    ]


def _optimizer_flags(d):
    """DP-SGD and the update rule."""
    return [
        ("bool", "dpsgd", d.dpsgd, "Train with DP-SGD; --nodpsgd trains non-privately "
                                   "(shuffled batches, ε = inf)."),
        ("enum", "optimizer", d.optimizer, "Update rule.", OPTIMIZERS),
        ("float", "learning_rate", d.learning_rate, "Learning rate."),
        ("enum", "lr_schedule", d.lr_schedule, "constant: --learning_rate throughout; cosine: "
                                               "from --learning_rate down to 0 along a "
                                               "half cosine over the run's steps.",
         LR_SCHEDULES),
        ("float", "momentum", d.momentum, "Momentum of --optimizer=sgd (0: plain SGD)."),
        ("float", "l2_norm_clip", d.l2_norm_clip, "Clipping norm C."),
        ("float", "noise_multiplier", None,
         f"Noise multiplier σ (default {DEFAULT_NOISE_MULTIPLIER} unless --target_epsilon)."),
        ("float", "target_epsilon", None, "Calibrate σ to reach this ε after --epochs."),
        ("integer", "batch_size", d.batch_size, "(Expected) batch size."),
        ("integer", "microbatches", None, "Microbatches per batch (default: one per "
                                          "example); must divide --batch_size."),
        ("integer", "epochs", d.epochs, "Epochs."),
        ("float", "ema_decay", None, "Average the weights: shadow <- d*shadow + (1-d)*w after "
                                     "each step; evaluate and save the average (no privacy "
                                     "cost: post-processing). Default: off; 0 turns off a "
                                     "recipe's."),
    ]


def _randomness_flags(d):
    """Sampling, accounting and seeds."""
    return [
        ("enum", "sampling", d.sampling, "poisson: Poisson-sampled batches (the ε "
                                         "accounting assumes); shuffle: shuffled fixed-size "
                                         "batches.", SAMPLINGS),
        ("bool", "poisson_padding", d.poisson_padding,
         "Pad Poisson batches to one fixed size (the default: a step's time does not "
         "depend on the secret batch size). --nopoisson_padding: each step computes on the "
         "sampled examples only (MNIST at batch 256: 256 instead of 380 rows); the same "
         "update and ε, but timing the steps reveals each batch's size."),
        ("enum", "accountant", d.accountant, "Privacy accountant.", ACCOUNTANTS),
        ("float", "delta", d.delta, "δ of the (ε, δ) guarantee."),
        ("integer", "seed", d.seed, "Seed of what is not privacy-relevant: weight "
                                    "initialisation, dropout, the shuffling of --nodpsgd runs. "
                                    "Never the DP noise, Poisson batches or DP shuffling: "
                                    "those are keyed by a secret from the OS's entropy."),
        ("integer", "insecure_dp_seed", None,
         "NOT PRIVATE, for debugging and tests: derive the DP noise, Poisson batches and "
         "DP shuffling from this seed, so the run is reproducible bit for bit but its ε "
         "does not hold (metrics.json and the summary say so)."),
    ]


def _augmentation_and_output_flags(d):
    """Augmentation multiplicity and what is written."""
    return [
        ("integer", "augmult", d.augmult,
         "Augmentation multiplicity K (De et al. 2022): each sampled example is trained on "
         "as K augmented copies (random shifts of up to --augment_shift pixels, and "
         "left-right flips with --augment_flip) whose mean gradient is clipped once: same "
         "ε, K times the compute. 1: no augmentation."),
        ("integer", "augment_shift", d.augment_shift,
         "With --augmult > 1: largest random shift, in pixels (zero fill). With "
         "--features=scatternet the features of every shifted training image are computed "
         "once ((2s+1)^2 times the features, kept in float16) and each copy takes a random "
         "one."),
        ("enum", "feature_storage", d.feature_storage,
         "With --features=scatternet --augmult > 1: how the shifted copies' features are "
         "cached: float16 (the plain images' in float32 beside them) or log8 (every copy "
         "and the plain training images in 8-bit logarithmic codes, <= 2.2% relative error, "
         "the test features computed in memory: MNIST's cache 2.14 GB instead of 4.9 GB).",
         FEATURE_STORAGES),
        ("bool", "augment_flip", d.augment_flip,
         "With --augmult > 1: also flip copies left-right at random (not for digits). With "
         "--features=scatternet the features of every mirrored (shifted) image are computed "
         "once too (twice the files)."),
        ("string", "output_dir", None, "Where to write results (default: write nothing)."),
        ("bool", "save_model", d.save_model, "Also save model.keras into --output_dir."),
        ("string", "recipe", None, "Named bundle of flag defaults (experiments/recipes.py, "
                                   "e.g. paper); flags given explicitly override it."),
    ]


def define_training_flags(flag_values, exclude=()):
    """Defines the train script's flags on ``flag_values`` (absl), except ``exclude``.

    Called from each script's ``main`` entry point, never at import time.
    """
    from absl import flags  # pylint: disable=g-import-not-at-top

    d = TrainConfig()
    specs = (_data_flags(d) + _model_flags(d) + _optimizer_flags(d) + _randomness_flags(d)
             + _augmentation_and_output_flags(d))
    for kind, name, default, help_text, *choices in specs:
        if name in exclude or name in flag_values:
            continue
        define = getattr(flags, f"DEFINE_{kind}")
        define(name, default, *choices, help_text, flag_values=flag_values)


def config_from_flags(flag_values, **overrides):
    """A TrainConfig from parsed absl flags (those defined), --recipe, then ``overrides``."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    values = {n: flag_values[n].value for n in names if n in flag_values}
    # --recipe's values fill in the flags not given on the command line.
    values = recipes.apply_recipe(values, {n for n in values if flag_values[n].present})
    values.update(overrides)
    _refuse_dp_flags_without_dpsgd(flag_values, values)
    return TrainConfig(**values)


# Flags with a default that only DP-SGD reads (those without one: common.validate_config).
_DP_ONLY_FLAGS = ("sampling", "accountant", "delta")


def _refuse_dp_flags_without_dpsgd(flag_values, values):
    """--nodpsgd with --sampling/--accountant/--delta given: they would be ignored silently
    (the run is shuffled, ε = inf; probe W 5)."""
    given = [n for n in _DP_ONLY_FLAGS if n in flag_values and flag_values[n].present]
    if given and not values.get("dpsgd", True):
        names = ", ".join(f"--{n}" for n in given)
        raise ConfigError(f"{names} {'has' if len(given) == 1 else 'have'} no effect with "
                          "--nodpsgd (non-private training: shuffled batches, ε = inf). Fix: "
                          f"drop {names}, or train with --dpsgd.")


def parse_floats(name, values):
    """Floats from an absl list flag (strings); ConfigError naming ``--name`` if one is not."""
    try:
        parsed = [float(v) for v in values]
    except (TypeError, ValueError):
        raise ConfigError(f"--{name}={','.join(map(str, values))} is invalid: give "
                          "comma-separated numbers, "
              f"e.g. --{name}=1,2,4.")
    if not parsed or not all(math.isfinite(v) for v in parsed):
        raise ConfigError(f"--{name} must list at least one finite number, e.g. --{name}=1,2,4.")
    return parsed


def absl_entry_point(define_flags, run_from_flags):
    """(main, cli) for a script: ``cli`` defines its flags and runs ``main`` under absl
    (after :func:`~tf_tempered.experiments.malloc_arenas.limit_malloc_arenas`).

    ``run_from_flags(FLAGS)`` does the work; a ConfigError it raises becomes absl's
    UsageError, so a bad flag prints the message and exits non-zero.
    """

    def main(argv):
        from absl import app, flags  # pylint: disable=g-import-not-at-top
        if len(argv) > 1:
            raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
        try:
            run_from_flags(flags.FLAGS)
        except ConfigError as e:
            raise app.UsageError(str(e)) from e

    def cli():
        from absl import app, flags  # pylint: disable=g-import-not-at-top
        # Before the scripts' threads allocate: resident memory that stays flat over a run.
        malloc_arenas.limit_malloc_arenas()
        before = set(flags.FLAGS)
        define_flags()
        declare_main_module_flags(flags.FLAGS, set(flags.FLAGS) - before)
        app.run(main)

    return main, cli


def declare_main_module_flags(flag_values, names):
    """Makes the flags ``names`` key flags of the main module, so that ``--help`` lists them.

    absl's ``--help`` (and ``--helpshort``) lists the key flags of the module named by
    ``sys.argv[0]`` only, i.e. the flags that module defined itself. The scripts define
    most of theirs here (:func:`define_training_flags`), and when run as a console script
    (``tf-tempered-train``) not even their own module is ``sys.argv[0]``, so without this
    ``--help`` showed a few flags or none, the rest only under ``--helpfull``.
    """
    for name in sorted(names):
        flag_values.register_key_flag_for_module(sys.argv[0], flag_values[name])

