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
"""``python -m tf_tempered.audit one-run``: white-box and black-box one-run audits.

Example (digits; how long it takes: docs/auditing.md)::

    python -m tf_tempered.audit one-run --dataset=digits --epochs=10 \\
        --noise_multiplier=1.0 --num_canaries=1000 --output_dir=runs/one_run

prints a line per epoch, then for each audit the accounted ε and the ε lower bounds
(Steinke et al. and f-DP) at the stated confidence, AUC and TPR at low FPR, and
writes ``one_run_results.json`` and ``one_run_audit.png`` to ``--output_dir``.
Flags are defined by :func:`define_flags`, called from :func:`run`, never at import.
"""

import dataclasses
import sys

from absl import app, flags

__all__ = ["SUBCOMMANDS", "define_flags", "config_from_flags", "main", "run"]

SUBCOMMANDS = ("one-run", "one_run")


def define_flags(flag_values=flags.FLAGS):
    """Defines the one-run flags on ``flag_values`` (idempotent)."""
    if "audits" in flag_values:
        return
    # pylint: disable=g-import-not-at-top
    from tf_tempered.audit.gradient_canaries import CANARY_KINDS
    from tf_tempered.audit.one_run_experiment import AUDITS, MODELS, OneRunConfig
    d, fv = OneRunConfig(), flag_values
    flags.DEFINE_enum("dataset", d.dataset, ["digits", "mnist", "fashion_mnist"], "Dataset.",
                      flag_values=fv)
    flags.DEFINE_string("data_dir", d.data_dir, "Folder with the MNIST / Fashion-MNIST files "
                        "(e.g. ../shared/data); default: the usual places.", flag_values=fv)
    flags.DEFINE_integer("num_train", d.num_train, "Training examples (default: all).",
                         lower_bound=2, flag_values=fv)
    flags.DEFINE_enum("model", d.model, list(MODELS), "A tanh MLP or CNN.", flag_values=fv)
    flags.DEFINE_enum("audits", d.audits, list(AUDITS), "Which one-run audits to run.",
                      flag_values=fv)
    flags.DEFINE_integer("num_canaries", d.num_canaries, "Canaries per audit (each in with "
                         "probability 1/2).", lower_bound=2, flag_values=fv)
    flags.DEFINE_integer("epochs", d.epochs, "Training epochs.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("batch_size", d.batch_size, "Expected Poisson batch size.",
                         lower_bound=1, flag_values=fv)
    flags.DEFINE_float("learning_rate", d.learning_rate, "Plain SGD learning rate.",
                       flag_values=fv)
    flags.DEFINE_float("noise_multiplier", d.noise_multiplier, "DP-SGD noise multiplier σ.",
                       lower_bound=0.0, flag_values=fv)
    flags.DEFINE_float("l2_norm_clip", d.l2_norm_clip, "DP-SGD clip norm C.", flag_values=fv)
    flags.DEFINE_float("delta", d.delta, "δ of the accounted ε and of the lower bounds.",
                       flag_values=fv)
    flags.DEFINE_float("significance", d.significance, "The bounds hold with probability "
                       "≥ 1 − significance.", flag_values=fv)
    flags.DEFINE_enum("canary_kind", d.canary_kind, list(CANARY_KINDS), "White-box canary "
                      "directions.", flag_values=fv)
    flags.DEFINE_float("canary_norm", d.canary_norm, "White-box canary gradient norm before "
                       "clipping (default: the clip norm).", flag_values=fv)
    flags.DEFINE_integer("seed", d.seed, "Seed of the canary choice and the weights; never of "
                         "the inclusion, the DP noise or the batches (secret).", flag_values=fv)
    flags.DEFINE_string("output_dir", "runs/one_run", "Where to write the JSON and the plot "
                        "('' = nowhere).", flag_values=fv)


def config_from_flags(flag_values=flags.FLAGS):
    """The OneRunConfig named by the parsed flags."""
    from tf_tempered.audit import one_run_experiment  # pylint: disable=g-import-not-at-top
    config_class = one_run_experiment.OneRunConfig
    return config_class(**{f.name: flag_values[f.name].value
                           for f in dataclasses.fields(config_class)})


def main(argv=None, flag_values=flags.FLAGS):
    """Runs the audits with the parsed flags; returns their OneRunResults."""
    if argv is not None and len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from tf_tempered.audit import one_run_experiment  # pylint: disable=g-import-not-at-top
    config = config_from_flags(flag_values)
    results = one_run_experiment.run_one_run(config)
    print()
    for result in results:
        print(result.summary())
    if flag_values.output_dir:
        paths = one_run_experiment.write_outputs(config, results, flag_values.output_dir)
        print(f"\nWrote {', '.join(paths)}")
    return results


def run(argv):
    """``argv`` = [program, flags...] (the subcommand removed): defines the flags, runs."""
    define_flags()
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(_app_main, argv=argv)


def _app_main(argv):
    main(argv)  # app.run exits with main's return value: return None
