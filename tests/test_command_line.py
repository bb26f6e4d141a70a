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
"""The experiment scripts' `--help` lists their own flags (tf_tempered/experiments/command_line.py).

absl's `--help` shows the key flags of the module named by `sys.argv[0]` only; the scripts'
flags are defined in command_line.py (and, for a console script such as tf-tempered-train,
`sys.argv[0]` is not even the script's module), so before the fix `--help` listed three flags
of train.py and none of the training flags, which appeared under `--helpfull` only.
"""

import subprocess
import sys

import pytest
from absl import flags

from tf_tempered.experiments import command_line

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

TRAINING_FLAGS = ("--dataset", "--activation", "--learning_rate", "--l2_norm_clip",
                  "--noise_multiplier", "--target_epsilon", "--batch_size", "--epochs",
                  "--sampling", "--delta", "--output_dir", "--recipe")


def test_declared_flags_are_the_main_modules_key_flags():
    """What `cli` does before `app.run`, on a fresh FlagValues: `--help` text then lists them."""
    flag_values = flags.FlagValues()
    assert flag_values.main_module_help() == ""
    command_line.define_training_flags(flag_values)
    command_line.declare_main_module_flags(flag_values, set(flag_values))
    text = flag_values.main_module_help()
    for name in TRAINING_FLAGS:
        assert f"  {name}: " in text, name
    assert "--[no]dpsgd" in text


def test_train_help_lists_the_training_flags():
    proc = subprocess.run([sys.executable, "-m", "tf_tempered.experiments.train", "--help"],
                          capture_output=True, text=True, timeout=300, check=False)
    # absl's --help exits with status 1 after printing the usage.
    assert proc.returncode in (0, 1) and "flags:" in proc.stdout, proc.stderr[-2000:]
    text = proc.stdout
    for name in TRAINING_FLAGS + ("--backup_dir", "--strategy", "--cpu_devices"):
        assert f"  {name}: " in text, (name, text[-3000:])
    # --help, not --helpfull: absl's own flags stay out of it.
    assert "--logtostderr" not in text
