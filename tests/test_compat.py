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
"""The compat bootstrap: Keras 2 bound, TF Privacy importable, a clear error otherwise."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tf_tempered import _compat
from tf_tempered._compat import keras, tensorflow_privacy, tf

# Also run on Python 3.11 with Keras 3 and TF Privacy installed (see conftest, .ci/run).
pytestmark = pytest.mark.keras_matrix
# The tests marked keras3_suite run a child process whose Keras they choose (its
# TF_USE_LEGACY_KERAS set or removed, not inherited): the same child whichever Keras
# this process binds, so the Keras 2 suite leaves them to the Keras 3 suite and to
# Python 3.11's keras_matrix run (tests/test_keras_versions.py does the same).

REPO = pathlib.Path(__file__).resolve().parents[1]


def _run(code, **env):
    full_env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=full_env, timeout=300)


def test_active_keras_is_the_one_tensorflow_binds():
    # Keras 3 unless TF_USE_LEGACY_KERAS=1 was set before TensorFlow was imported.
    if _compat.legacy_keras_requested():
        import tf_keras  # pylint: disable=import-outside-toplevel
        assert tf.keras.__name__.startswith("tf_keras") and _compat.KERAS_MAJOR == 2
        assert tf_keras.__version__.startswith("2.") and keras.Model is tf_keras.Model
    else:
        import keras as keras3  # pylint: disable=import-outside-toplevel
        assert keras is keras3 and keras.__version__.startswith("3.") and _compat.KERAS_MAJOR == 3
        assert tensorflow_privacy is None  # TF Privacy is Keras 2 only


@pytest.mark.parametrize("value, legacy", [("1", True), ("true", True), ("True", True),
                                           ("0", False), ("", False), (None, False)])
def test_legacy_keras_requested_follows_tensorflows_rule(value, legacy):
    environ = {} if value is None else {"TF_USE_LEGACY_KERAS": value}
    assert _compat.legacy_keras_requested(environ) is legacy


@pytest.mark.keras3_suite
def test_import_has_no_side_effect_on_the_keras_version():
    result = _run("import tf_tempered, keras, tensorflow as tf, sys, os; "
                  "print(keras.__version__, tf.keras.__name__, 'tf_keras' in sys.modules, "
                  "os.environ.get('TF_USE_LEGACY_KERAS'))")
    assert result.returncode == 0, result.stderr[-3000:]
    version, bound, tf_keras_loaded, env = result.stdout.split()[-4:]
    assert version.startswith("3.") and bound.startswith("keras")
    assert (tf_keras_loaded, env) == ("False", "None")


@pytest.mark.keras3_suite
def test_legacy_keras_is_selected_the_standard_way():
    result = _run("import tf_tempered, tensorflow as tf; from tf_tempered._compat import keras; "
                  "print(tf.keras.__name__, keras.__version__)", TF_USE_LEGACY_KERAS="1")
    assert result.returncode == 0, result.stderr[-3000:]
    bound, version = result.stdout.split()[-2:]
    assert bound.startswith("tf_keras") and version.startswith("2.")


_MIXED = """
import numpy as np, tf_tempered
from tf_tempered._compat import keras
import {other} as other
model = {model}
try:
    {call}
except TypeError as e:
    print("REFUSED", e)
"""


# Keras 2 active with a Keras 3 model by default; the other way round with --extended (the
# same refusal, 18 s of subprocess each).
@pytest.mark.keras3_suite
@pytest.mark.parametrize("active, other", [pytest.param("3", "tf_keras", marks=pytest.mark.extended),
                                           ("2", "keras")])
def test_mixing_the_two_kerases_fails_with_one_clear_message(active, other):
    env = {"TF_USE_LEGACY_KERAS": "1"} if active == "2" else {}
    # A model of the other Keras given to make_private.
    result = _run(_MIXED.format(
        other=other, model="other.Sequential([other.Input((3,)), other.layers.Dense(2)])",
        call="tf_tempered.make_private(model)"), **env)
    assert "REFUSED" in result.stdout, result.stderr[-3000:]
    assert "cannot be mixed" in result.stdout and "TF_USE_LEGACY_KERAS" in result.stdout
    # A model of the active Keras compiled with the other Keras' optimizer: Keras itself may
    # refuse at compile (Keras 3 does), else the DP step does, with our message.
    code = _MIXED.format(
        other=other, model="tf_tempered.make_private(keras.Sequential([keras.Input((3,)), "
                           "keras.layers.Dense(2)]), l2_norm_clip=1.0, noise_multiplier=0.0)",
        call=("model.compile(optimizer=other.optimizers.SGD(0.1), loss=keras.losses."
              "SparseCategoricalCrossentropy(from_logits=True, reduction='none')); "
              "model.fit(np.ones((4, 3)), np.zeros(4), verbose=0)"))
    result = _run(code.replace("except TypeError", "except (TypeError, ValueError)"), **env)
    assert "REFUSED" in result.stdout, result.stderr[-3000:]


@pytest.mark.tf_privacy
def test_tf_privacy_public_names_work_after_import():
    for name in ("DPKerasSGDOptimizer", "DPKerasAdamOptimizer", "VectorizedDPKerasSGDOptimizer",
                 "DPSequential", "DPModel", "compute_dp_sgd_privacy_statement",
                 "GaussianSumQuery"):
        assert hasattr(tensorflow_privacy, name), name
    opt = tensorflow_privacy.DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1)
    assert isinstance(opt, keras.optimizers.legacy.SGD)
    statement = tensorflow_privacy.compute_dp_sgd_privacy_statement(
        number_of_examples=60000, batch_size=256, num_epochs=1, noise_multiplier=1.1,
        delta=1e-5)
    assert "Epsilon" in statement or "epsilon" in statement


@pytest.mark.tf_privacy
def test_import_first_then_tensorflow_works_in_fresh_process():
    result = _run("import tf_tempered, tensorflow as tf; "
                  "from tensorflow_privacy.privacy.keras_models.dp_keras_model import DPSequential; "
                  "print(tf.keras.__name__)", TF_USE_LEGACY_KERAS="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().endswith("tf_keras.api._v2.keras") or "tf_keras" in result.stdout


@pytest.mark.keras3_suite
def test_tensorflow_imported_but_keras_unbound_is_fine():
    result = _run("import tensorflow as tf; import tf_tempered; print(tf.keras.__name__)",
                  TF_USE_LEGACY_KERAS="1")
    assert result.returncode == 0, result.stderr
    assert "tf_keras" in result.stdout


@pytest.mark.keras3_suite
def test_legacy_requested_after_keras3_was_bound_raises_with_the_fix():
    result = _run("import os, tensorflow as tf; tf.keras.layers; "
                  "os.environ['TF_USE_LEGACY_KERAS'] = '1'; import tf_tempered")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    message = result.stderr[result.stderr.index("ImportError"):]
    assert "TF_USE_LEGACY_KERAS=1" in message and "restart" in message


def test_bootstrap_is_idempotent():
    assert _compat.bootstrap()[0] is tf


@pytest.mark.keras3_suite
def test_without_tf_privacy_the_package_trains_privately_and_says_how_to_get_it():
    # sys.modules[name] = None makes the import fail as if it were not installed
    # (as on Python 3.12+), also where it is installed.
    code = """
import sys
sys.modules["tensorflow_privacy"] = None
import numpy as np
import tf_tempered
from tf_tempered._compat import keras, require_tensorflow_privacy, tensorflow_privacy

assert tensorflow_privacy is None
try:
    require_tensorflow_privacy("The comparison")
except ImportError as e:
    print(e)
model = tf_tempered.make_private(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
model.compile(optimizer=tf_tempered.DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                         learning_rate=0.1),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"))
before = model.get_weights()[0].copy()
model.fit(np.ones((4, 3), "float32"), np.zeros(4), batch_size=2, verbose=0)
print("changed", bool(np.any(model.get_weights()[0] != before)))
"""
    result = _run(code)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "The comparison needs TensorFlow Privacy" in result.stdout
    assert "pip install tensorflow-privacy" in result.stdout
    assert "from tf_tempered.privacy import DPKerasSGDOptimizer" in result.stdout
    assert "changed True" in result.stdout


def test_require_tensorflow_privacy_matches_what_is_installed():
    import importlib.util  # pylint: disable=import-outside-toplevel
    if tensorflow_privacy is None and importlib.util.find_spec("tensorflow_privacy") is not None:
        # Installed, but this process uses Keras 3: the fix is to select Keras 2.
        with pytest.raises(ImportError, match="Keras 2 only.*TF_USE_LEGACY_KERAS=1"):
            _compat.require_tensorflow_privacy()
    elif tensorflow_privacy is None:
        with pytest.raises(ImportError, match="Python <= 3.11"):
            _compat.require_tensorflow_privacy()
    else:
        assert _compat.require_tensorflow_privacy() is tensorflow_privacy


def test_readme_test_command_is_what_ci_runs():
    readme = (REPO / "README.md").read_text()
    ci = (REPO / ".ci" / "run").read_text()
    commands = re.findall(r"(python -m pytest[^\n`]*)$", readme, flags=re.M)
    assert commands, "README.md must show the test command"
    assert any(c in ci for c in commands), "'.ci/run' must run README.md's test command"
