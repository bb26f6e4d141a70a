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
"""Tests for the `python -m tf_tempered.privacy.epsilon` CLI, run in subprocesses."""

import os
import pathlib
import re
import subprocess
import sys
import warnings

import pytest
from absl import flags
from once_per_session import once_per_session

from tf_tempered.privacy import accounting, epsilon

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

BASE = ["--num_examples=60000", "--batch_size=256", "--delta=1e-5"]
# Run as `python -m` (each process pays TensorFlow's import): a report, and a refusal.
RUNS = {
    "target": BASE + ["--target_epsilon=3", "--epochs=60"],
    "too_big_batch": ["--num_examples=100", "--batch_size=256", "--delta=1e-5",
                      "--noise_multiplier=1.1", "--epochs=1"],
}
# Run in this process, through the CLI's flags and report_from_flags.
IN_PROCESS = {
    "sigma": BASE + ["--noise_multiplier=1.1", "--epochs=60"],
    # 468 steps of 256 touch each example at most ceil(468·256/60000) = 2 times.
    "shuffle_pld": BASE + ["--noise_multiplier=1.1", "--steps=468", "--sampling=shuffle",
                           "--accountant=pld", "--microbatch_size=4"],
}


@pytest.fixture(scope="module")
def cli(tmp_path_factory):
    """Runs all the CLI invocations at once (each pays TensorFlow's import time)."""
    return once_per_session(tmp_path_factory, "epsilon_cli", _run_cli)


def _run_cli():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    procs = {name: subprocess.Popen(
        [sys.executable, "-m", "tf_tempered.privacy.epsilon", *args], cwd=REPO_ROOT, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for name, args in RUNS.items()}
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        results[name] = (proc.returncode, out, err)
    return results


def _report(name):
    """(report, warning texts) of the IN_PROCESS flags, parsed as the CLI parses them."""
    values = flags.FlagValues()
    epsilon.define_flags(values)
    values(["prog", *IN_PROCESS[name]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = epsilon.report_from_flags(values)
    return report, " ".join(str(w.message) for w in caught)


def _value(name, out):
    return float(re.search(rf"^{name} = (\S+)$", out, re.M).group(1))


def test_prints_epsilon_of_compute_epsilon():
    out, _ = _report("sigma")
    expected = accounting.compute_epsilon(num_examples=60000, batch_size=256,
                                          noise_multiplier=1.1, epochs=60, delta=1e-5)
    assert _value("epsilon", out) == expected
    assert _value("noise_multiplier", out) == 1.1
    assert "14063 steps (60 epochs)" in out and "Poisson" in out


def test_prints_calibrated_sigma(cli):
    rc, out, err = cli["target"]
    assert rc == 0, err
    sigma = accounting.noise_multiplier_for_epsilon(
        target_epsilon=3.0, num_examples=60000, batch_size=256, epochs=60, delta=1e-5)
    assert _value("noise_multiplier", out) == sigma
    assert 0.99 * 3.0 <= _value("epsilon", out) <= 3.0
    assert _value("epsilon", out) == accounting.compute_epsilon(
        num_examples=60000, batch_size=256, noise_multiplier=sigma, epochs=60, delta=1e-5)


def test_shuffle_is_labelled_without_amplification():
    out, err = _report("shuffle_pld")
    assert "WITHOUT amplification" in out and "(2 Gaussian mechanisms composed)" in out
    assert "WITHOUT privacy amplification" in err  # the warning
    assert "accountant: PLD" in out and "microbatch_size = 4" in out
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = accounting.compute_epsilon(
            num_examples=60000, batch_size=256, noise_multiplier=1.1, steps=468, delta=1e-5,
            sampling="shuffle", accountant="pld", microbatch_size=4)
    assert _value("epsilon", out) == expected


def test_bad_flag_values_fail_with_message(cli):
    rc, out, err = cli["too_big_batch"]
    assert rc == 1
    assert "batch_size=256 is larger than num_examples=100" in out + err
    assert "epsilon = " not in out


def test_importing_defines_no_global_flags():
    assert epsilon.__name__ not in flags.FLAGS.flags_by_module_dict()
    fresh = flags.FlagValues()
    epsilon.define_flags(fresh)
    epsilon.define_flags(fresh)  # idempotent
    fresh(["prog", "--num_examples=10", "--batch_size=2", "--delta=1e-3", "--steps=3",
           "--noise_multiplier=2"])
    assert (fresh.num_examples, fresh.sampling, fresh.accountant, fresh.microbatch_size) == (
        10, "poisson", "rdp", 1)


@pytest.mark.parametrize("args,message", [
    (["--epochs=60"], "Exactly one of (noise_multiplier, target_epsilon)"),
    (["--noise_multiplier=1", "--target_epsilon=1", "--epochs=60"], "Exactly one of"),
    (["--noise_multiplier=1"], "Exactly one of (epochs, steps)"),
    (["--noise_multiplier=1", "--epochs=1", "--sampling=uniform"], "poisson|shuffle"),
])
def test_flag_rules_reject_bad_combinations(args, message):
    fresh = flags.FlagValues()
    epsilon.define_flags(fresh)
    with pytest.raises(flags.Error, match=re.escape(message)):
        fresh(["prog", *BASE, *args])


def test_privacy_report_needs_one_of_sigma_and_target():
    with pytest.raises(ValueError, match="noise_multiplier and target_epsilon"):
        epsilon.privacy_report(num_examples=100, batch_size=10, delta=1e-3, epochs=1)
