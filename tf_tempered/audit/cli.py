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
"""``python -m tf_tempered.audit``: audit a non-private and a DP-SGD CNN on an MNIST subset.

Example::

    python -m tf_tempered.audit --num_train=1000 --epochs=40 --noise_multiplier=1.1 \\
        --data_dir=../shared/data --output_dir=runs/audit

prints the attack table (AUC, advantage, TPR at 0.1% and 1% FPR, empirical ε lower
bound with Clopper–Pearson confidence, accounted ε) and the model table (accuracy,
canary exposure), and writes ``roc_linear.png``, ``roc_loglog.png``,
``results.json``, the models and ``audit_config.json`` to ``--output_dir``.
``--model_path`` audits the models saved by an earlier run instead of training.
Flags are defined by :func:`define_flags`, called from :func:`run`, never at import.

``python -m tf_tempered.audit one-run ...`` runs the one-run audits instead
(white-box and black-box, one training run each; :mod:`.one_run_cli`).
"""

import dataclasses
import json
import os
import sys

from absl import app, flags

from tf_tempered.audit import one_run_cli

__all__ = ["define_flags", "config_from_flags", "main", "run"]


def define_flags(flag_values=flags.FLAGS):
    """Defines the audit flags on ``flag_values`` (idempotent)."""
    if "num_canaries" in flag_values:
        return
    from tf_tempered.audit.experiment import AuditConfig  # pylint: disable=g-import-not-at-top
    d = AuditConfig()
    fv = flag_values
    flags.DEFINE_enum("dataset", d.dataset, ["mnist", "fashion_mnist"], "Dataset.", flag_values=fv)
    flags.DEFINE_string("data_dir", d.data_dir, "Folder with the dataset files (e.g. "
                        "../shared/data); default: the usual places.", flag_values=fv)
    flags.DEFINE_integer("num_train", d.num_train, "Members (kept few, so that they overfit) "
                         "and as many non-members: a random split of 2·num_train training "
                         "images.", lower_bound=2,
                         flag_values=fv)
    flags.DEFINE_integer("num_canaries", d.num_canaries, "Mislabeled canaries inserted into "
                         "training (and as many never-trained controls).", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_integer("epochs", d.epochs, "Training epochs.", lower_bound=1, flag_values=fv)
    flags.DEFINE_integer("batch_size", d.batch_size, "Batch size (expected size for the "
                         "Poisson-sampled DP model).", lower_bound=1, flag_values=fv)
    flags.DEFINE_float("learning_rate", d.learning_rate, "SGD learning rate (both models).",
                       flag_values=fv)
    flags.DEFINE_float("noise_multiplier", d.noise_multiplier, "DP-SGD noise multiplier σ.",
                       lower_bound=0.0, flag_values=fv)
    flags.DEFINE_float("l2_norm_clip", d.l2_norm_clip, "DP-SGD clip norm C.", flag_values=fv)
    flags.DEFINE_float("delta", d.delta, "δ for the accounted ε and the ε lower bound.",
                       flag_values=fv)
    flags.DEFINE_string("activation", d.activation, "Activation of the CNN ('tanh', 'relu', "
                        "'tempered_sigmoid', ...).", flag_values=fv)
    flags.DEFINE_integer("num_shadow", d.num_shadow, "Shadow models per model for LiRA "
                         "(0 = no LiRA; at least 2, LiRA's paper uses 16+).", lower_bound=0,
                         flag_values=fv)
    flags.DEFINE_float("confidence", d.confidence, "Clopper–Pearson confidence of ε_lb.",
                       flag_values=fv)
    flags.DEFINE_integer("seed", d.seed, "Seed of the data split, canaries, shadow-model "
                         "splits and weight initialisation; never of the DP noise or Poisson "
                         "batches (secret).", flag_values=fv)
    flags.DEFINE_integer("insecure_dp_seed", None, "NOT PRIVATE, for debugging: derive the "
                         "DP model's noise and Poisson batches from this seed (reproducible; "
                         "its accounted ε does not hold).", flag_values=fv)
    flags.DEFINE_string("output_dir", "runs/audit", "Where to write plots, results and models "
                        "('' = nowhere).", flag_values=fv)
    flags.DEFINE_string("model_path", None, "Folder of an earlier run to audit its saved "
                        "models (its audit_config.json replaces the data and training flags; "
                        "--num_shadow, --confidence and --delta still apply).",
                        flag_values=fv)


def config_from_flags(flag_values=flags.FLAGS):
    """The AuditConfig named by the parsed flags."""
    from tf_tempered.audit.experiment import AuditConfig  # pylint: disable=g-import-not-at-top
    return AuditConfig(**{f.name: flag_values[f.name].value
                          for f in dataclasses.fields(AuditConfig)})


def main(argv=None, flag_values=flags.FLAGS):
    """Runs the audit with the parsed flags, prints the tables; returns the audits."""
    if argv is not None and len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    from tf_tempered.audit import experiment, report  # pylint: disable=g-import-not-at-top
    config = config_from_flags(flag_values)
    if config.num_shadow == 1:
        raise app.UsageError("--num_shadow must be 0 (no LiRA) or at least 2.")
    output_dir = flag_values.output_dir or None
    audits = experiment.run_audit(config, output_dir=output_dir,
                                  model_path=flag_values.model_path)
    print()
    print(report.format_report(audits))
    if output_dir:
        paths = report.plot_rocs(audits, output_dir)
        results = os.path.join(output_dir, "results.json")
        with open(results, "w", encoding="utf-8") as f:
            json.dump(report.to_dict(audits), f, indent=2)
        print(f"\nWrote {', '.join(paths + [results])}")
    return audits


def run():
    """Console entry point: defines the flags, then ``app.run(main)``; with the
    subcommand ``one-run`` first, the one-run audit's (:func:`.one_run_cli.run`)."""
    if len(sys.argv) > 1 and sys.argv[1] in one_run_cli.SUBCOMMANDS:
        one_run_cli.run([sys.argv[0]] + sys.argv[2:])
        return
    define_flags()
    # `--help` lists the main module's flags: make ours key flags of it (python -m or
    # a console script), not only of this module.
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
    app.run(_app_main)


def _app_main(argv):
    main(argv)  # app.run exits with main's return value: return None
