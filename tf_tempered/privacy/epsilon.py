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
"""Prints the ε of a DP-SGD run, or the noise multiplier σ that reaches a target ε.

Usage:

  python -m tf_tempered.privacy.epsilon --num_examples=60000 --batch_size=256 \\
      --noise_multiplier=1.1 --epochs=60 --delta=1e-5
  tf-tempered-epsilon --num_examples=60000 --batch_size=256 --target_epsilon=3 \\
      --epochs=60 --delta=1e-5

Give exactly one of --noise_multiplier / --target_epsilon and one of --epochs / --steps.
--sampling=poisson (default) assumes Poisson sampling (amplification by subsampling);
--sampling=shuffle reports the bound WITHOUT amplification (one Gaussian per epoch).
--accountant=rdp|pld, --microbatch_size (> 1 doubles the sensitivity).
"""

import sys

from absl import app
from absl import flags

from tf_tempered.privacy import accounting

__all__ = ["privacy_report", "define_flags", "main"]


def privacy_report(*, num_examples, batch_size, delta, noise_multiplier=None,
                   target_epsilon=None, epochs=None, steps=None,
                   sampling=accounting.DEFAULT_SAMPLING,
                   accountant=accounting.DEFAULT_ACCOUNTANT, microbatch_size=1):
    """The text the CLI prints: the setting, σ and ε (σ calibrated if target_epsilon given).

    (The CLI prints ε with all its digits; the example shows four, as the last ones depend
    on the dp-accounting version.)

    >>> print(privacy_report(num_examples=60000, batch_size=256, noise_multiplier=1.1,
    ...                      epochs=60, delta=1e-5))
    DP-SGD: 60000 examples, batch size 256, 14063 steps (60 epochs), delta = 1e-05
    sampling: Poisson, q = 0.00426667 (amplified by subsampling)
    accountant: RDP
    noise_multiplier = 1.1
    epsilon = 2.5967
    """
    if (noise_multiplier is None) == (target_epsilon is None):
        raise ValueError(f"Give exactly one of noise_multiplier and target_epsilon (got "
                         f"noise_multiplier={noise_multiplier!r}, target_epsilon="
                         f"{target_epsilon!r}).")
    setting = dict(num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                   steps=steps, delta=delta, sampling=sampling, accountant=accountant,
                   microbatch_size=microbatch_size)
    if target_epsilon is not None:
        noise_multiplier = accounting.noise_multiplier_for_epsilon(
            target_epsilon=target_epsilon, **setting)
    epsilon = accounting.compute_epsilon(noise_multiplier=noise_multiplier, **setting)
    count = accounting.num_steps(num_examples=num_examples, batch_size=batch_size,
                                 epochs=epochs, steps=steps)
    span = f"{count} steps" + (f" ({epochs:g} epochs)" if epochs is not None else "")
    lines = [f"DP-SGD: {num_examples} examples, batch size {batch_size:g}, {span}, "
             f"delta = {delta:g}"]
    if sampling == "poisson":
        lines.append(f"sampling: Poisson, q = {batch_size / num_examples:.6g} "
                     f"(amplified by subsampling)")
    else:
        passes = accounting.make_dp_event(num_examples=num_examples, batch_size=batch_size,
                                          noise_multiplier=1.0, epochs=epochs, steps=steps,
                                          sampling=sampling).count
        lines.append(f"sampling: shuffle, once-per-epoch bound WITHOUT amplification by "
                     f"subsampling ({passes} Gaussian mechanisms composed)")
    lines.append(f"accountant: {accountant.upper()}")
    if microbatch_size > 1:
        lines.append(f"microbatch_size = {microbatch_size} (> 1: sensitivity doubled, "
                     f"accounted as noise_multiplier / 2)")
    if target_epsilon is not None:
        lines.append(f"target_epsilon = {target_epsilon:g}")
    lines.append(f"noise_multiplier = {noise_multiplier!r}")
    lines.append(f"epsilon = {epsilon!r}")
    return "\n".join(lines)


def define_flags(flag_values=flags.FLAGS):
    """Defines the CLI's flags on ``flag_values`` (once; importing the module defines none)."""
    if "num_examples" in flag_values:
        return
    kw = dict(flag_values=flag_values)
    flags.DEFINE_integer("num_examples", None, "Number of training examples N.", **kw)
    flags.DEFINE_integer("batch_size", None,
                         "Batch size B (expected batch size under Poisson sampling).", **kw)
    flags.DEFINE_float("noise_multiplier", None, "Noise multiplier σ (noise stddev / clip).",
                       **kw)
    flags.DEFINE_float("target_epsilon", None, "Target ε: print the σ that reaches it.", **kw)
    flags.DEFINE_float("epochs", None, "Epochs (steps = ceil(epochs·N/B)).", **kw)
    flags.DEFINE_integer("steps", None, "Number of DP-SGD steps.", **kw)
    flags.DEFINE_float("delta", None, "δ of the (ε, δ) guarantee; keep it below 1/N.", **kw)
    flags.DEFINE_enum("sampling", accounting.DEFAULT_SAMPLING, list(accounting.SAMPLINGS),
                      "poisson: amplified by subsampling; shuffle: once-per-epoch bound "
                      "WITHOUT amplification.", **kw)
    flags.DEFINE_enum("accountant", accounting.DEFAULT_ACCOUNTANT, list(accounting.ACCOUNTANTS),
                      "Privacy accountant of dp_accounting.", **kw)
    flags.DEFINE_integer("microbatch_size", 1,
                         "Examples per microbatch; > 1 doubles the sensitivity.", **kw)
    flags.mark_flags_as_required(["num_examples", "batch_size", "delta"], **kw)
    flags.mark_flags_as_mutual_exclusive(["noise_multiplier", "target_epsilon"],
                                         required=True, **kw)
    flags.mark_flags_as_mutual_exclusive(["epochs", "steps"], required=True, **kw)


def report_from_flags(values=flags.FLAGS):
    """The CLI's report for parsed flag values (of :func:`define_flags`)."""
    try:
        return privacy_report(
            num_examples=values.num_examples, batch_size=values.batch_size,
            delta=values.delta, noise_multiplier=values.noise_multiplier,
            target_epsilon=values.target_epsilon, epochs=values.epochs, steps=values.steps,
            sampling=values.sampling, accountant=values.accountant,
            microbatch_size=values.microbatch_size)
    except ValueError as e:
        raise app.UsageError(str(e)) from e


def _main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    print(report_from_flags())


def main(argv=None):
    """Console-script entry point (``tf-tempered-epsilon``)."""
    before = set(flags.FLAGS)
    define_flags()
    # absl's --help lists the flags of the module named by sys.argv[0] only: the
    # console script's is not this module, so mark them as its flags.
    for name in sorted(set(flags.FLAGS) - before):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
    app.run(_main, argv=argv if argv is not None else sys.argv)


if __name__ == "__main__":
    main()
