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
"""Which Keras tf_tempered's public objects belong to.

The values, validation, learnable weights and save/load of the tempered sigmoid are
tested in test_activations.py and test_layers.py, which run on the active Keras
(Keras 3 by default, Keras 2 with TF_USE_LEGACY_KERAS=1). Here: the top-level names
resolve to the active Keras, and (in fresh processes, whichever
Keras this one runs) that `import tf_tempered` leaves the user's Keras choice alone.
"""

import importlib
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tf_tempered
from tf_tempered import _compat
from tf_tempered._compat import KERAS_MAJOR, keras, tf

# Also run on Python 3.11 with Keras 3 and TF Privacy installed (see conftest, .ci/run).
pytestmark = pytest.mark.keras_matrix
# The tests marked keras3_suite run a child process whose Keras they choose (its
# TF_USE_LEGACY_KERAS set or removed, not inherited): the same child whichever Keras
# this process binds, so the Keras 2 suite leaves them to the Keras 3 suite and to
# Python 3.11's keras_matrix run (tests/test_keras_versions.py does the same).

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ACTIVE_PACKAGE = "keras" if KERAS_MAJOR == 3 else "tf_keras"


def test_top_level_names_are_the_active_keras_objects():
    assert tf_tempered.TemperedSigmoid is tf_tempered.layers.TemperedSigmoid
    assert tf_tempered.tempered_sigmoid is tf_tempered.activations.tempered_sigmoid
    assert issubclass(tf_tempered.TemperedSigmoid, keras.layers.Layer)
    layer_base = tf_tempered.TemperedSigmoid.__mro__[1]
    assert layer_base is keras.layers.Layer
    assert layer_base.__module__.split(".")[0] == ACTIVE_PACKAGE
    assert keras.saving.get_registered_name(tf_tempered.TemperedSigmoid) == (
        "tf_tempered>TemperedSigmoid")
    assert keras.saving.get_registered_object("tf_tempered>TemperedSigmoid") is (
        tf_tempered.TemperedSigmoid)
    # The layer goes into models of the active Keras (and tf.keras is that Keras).
    assert tf.keras.layers.Layer is keras.layers.Layer
    model = keras.Sequential([keras.Input((3,)), tf_tempered.TemperedSigmoid(1.0, 1.0, 0.0)])
    x = np.array([[-1.0, 0.0, 2.0]], np.float32)
    np.testing.assert_allclose(np.asarray(model(x)), 1.0 / (1.0 + np.exp(-x)), rtol=1e-6)


CHILD_CODE = r'''
import json, sys
import tf_tempered  # first, as a user would
import keras
import tensorflow as tf
from tf_tempered._compat import KERAS_MAJOR

out = {"keras_version": keras.__version__, "keras_major": KERAS_MAJOR,
       "tf_keras_layer_is_keras3": tf.keras.layers.Layer is keras.layers.Layer,
       "tf_keras_imported": "tf_keras" in sys.modules,
       "layer_base_module": tf_tempered.TemperedSigmoid.__mro__[1].__module__}
print("RESULT:" + json.dumps(out))
'''


def _child(legacy):
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    if legacy:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", CHILD_CODE], env=env, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, (
        f"child failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT:"):])


@pytest.mark.keras3_suite
def test_import_leaves_keras3_bound_without_the_legacy_variable():
    out = _child(legacy=False)
    assert out["keras_version"].startswith("3.") and out["keras_major"] == 3
    assert out["tf_keras_layer_is_keras3"] is True
    assert out["tf_keras_imported"] is False
    assert out["layer_base_module"].startswith("keras.")


@pytest.mark.keras3_suite
@pytest.mark.skipif(importlib.util.find_spec("tf_keras") is None, reason="tf-keras not installed")
def test_legacy_variable_gives_keras2_objects():
    out = _child(legacy=True)
    assert out["keras_major"] == 2
    assert out["layer_base_module"].startswith("tf_keras.")
    assert out["tf_keras_layer_is_keras3"] is False


def test_compat_reports_the_active_keras():
    assert _compat.keras is keras and KERAS_MAJOR == int(keras.__version__.split(".")[0])
