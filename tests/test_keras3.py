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
"""Tests of tf_tempered.keras3, run in a fresh process with Keras 3 imported first.

This process has Keras 2 bound to tf.keras (tests/conftest.py), so the Keras 3
checks run once in a subprocess that prints its findings as one JSON line; the
tests below assert on them.
"""

import json
import os
import subprocess
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD_CODE = r'''
import importlib, json, os, sys, types
import numpy as np
from scipy.special import expit

import keras  # Keras 3, imported before tf_tempered as a Keras 3 user would
import tf_tempered.keras3 as k3t
from tf_tempered.activations import smallest_normal
import tensorflow as tf

out = {"keras_version": keras.__version__, "backend": keras.backend.backend(),
       "tf_keras_name": tf.keras.__name__, "dense_module": keras.layers.Dense.__module__}
P = (1.5, 3.0, 0.2)
x = np.concatenate([np.linspace(-8, 8, 81), [-1e4, -50.0, 50.0, 1e4]])

# Values against NumPy (errors in units of the dtype's eps times s + |o|).
errors = {}
for dtype in ("float32", "float64"):
    eps = float(np.finfo(dtype).eps)
    for p in [(2.0, 2.0, 1.0), (1.0, 1.0, 0.0), P, (0.5, 4.0, -2.0)]:
        xt = keras.ops.convert_to_tensor(x, dtype=dtype)
        for kind, args in (("python", p),
                           ("tensors", [keras.ops.convert_to_tensor(v, dtype) for v in p])):
            y = k3t.tempered_sigmoid(xt, *args)
            assert keras.backend.standardize_dtype(y.dtype) == dtype
            ref = p[0] * expit(p[1] * x) - p[2]
            err = np.max(np.abs(keras.ops.convert_to_numpy(y).astype(np.float64) - ref))
            errors[f"{dtype}{p}{kind}"] = float(err / (eps * (p[0] + abs(p[2]))))
out["value_errors_in_eps"] = errors
xt = keras.ops.convert_to_tensor(x, dtype="float32")
out["default_equals_tanh"] = bool(np.array_equal(
    keras.ops.convert_to_numpy(k3t.tempered_sigmoid(xt)),
    keras.ops.convert_to_numpy(keras.ops.tanh(xt))))

# Validation: the same messages as the Keras 2 layer.
messages = {}
for name, value in (("scale", 0.0), ("inverse_temperature", float("nan")),
                    ("offset", float("inf")), ("learnable", "yes")):
    try:
        k3t.TemperedSigmoid(**{name: value})
        messages[name] = None
    except ValueError as e:
        messages[name] = str(e)
out["validation_messages"] = messages

# Config round trip, and generic deserialization without custom_objects.
layer = k3t.TemperedSigmoid(*P, learnable=True, name="ts")
config = layer.get_config()
out["config"] = {k: config[k] for k in ("scale", "inverse_temperature", "offset", "learnable")}
out["config_round_trip"] = k3t.TemperedSigmoid.from_config(config).get_config() == config
revived = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
out["deserialized_type"] = type(revived).__module__ + "." + type(revived).__name__

# Learnable weights: initial values, floor after underflow, dtype policy.
batch = np.random.RandomState(0).randn(6, 3).astype("float32")
layer(batch)
values = lambda l: [float(l.scale), float(l.inverse_temperature), float(l.offset)]
out["learnable_initial"] = values(layer)
out["learnable_weight_paths"] = [w.path for w in layer.trainable_weights]
out["fixed_weights"] = len(k3t.TemperedSigmoid(*P).weights)
layer.trainable_weights[0].assign(-200.0)
out["floored_scale"] = float(layer.scale)
out["smallest_normal_float32"] = smallest_normal("float32")
mixed = k3t.TemperedSigmoid(learnable=True, dtype="mixed_float16")
out["mixed_dtypes"] = [keras.backend.standardize_dtype(mixed(batch).dtype),
                       [w.dtype for w in mixed.weights]]
out["output_shape"] = list(layer.compute_output_shape((None, 3, 5)))

# A small model: fit one step, save to .keras, reload, same outputs.
inputs = keras.Input((3,))
hidden = k3t.TemperedSigmoid(*P, learnable=True, name="ts_layer")(keras.layers.Dense(4)(inputs))
hidden = keras.layers.Dense(4, activation=k3t.TemperedSigmoid(learnable=True), name="d_ts")(hidden)
hidden = keras.layers.Dense(4, activation=k3t.tempered_sigmoid, name="d_fn")(hidden)
model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
model.compile(keras.optimizers.SGD(0.1), "mse")
history = model.fit(batch, np.ones((6, 2)), batch_size=6, epochs=1, verbose=0)
out["fit_loss_finite"] = bool(np.isfinite(history.history["loss"][0]))
trained = values(model.get_layer("ts_layer"))
out["trained_values_moved"] = [abs(a - b) > 1e-7 for a, b in zip(trained, P)]
path = os.path.join(sys.argv[1], "model.keras")
model.save(path)
loaded = keras.saving.load_model(path)
out["reloaded_identical"] = bool(np.array_equal(loaded.predict(batch, verbose=0),
                                                model.predict(batch, verbose=0)))
out["reloaded_values_identical"] = (values(loaded.get_layer("ts_layer")) == trained and
                                    values(loaded.get_layer("d_ts").activation)
                                    == values(model.get_layer("d_ts").activation))
out["reloaded_fn_activation"] = loaded.get_layer("d_fn").activation is k3t.tempered_sigmoid

# A `keras` that is not Keras 3 must give a clear ImportError.
real_keras = sys.modules["keras"]
sys.modules["keras"] = types.SimpleNamespace(__version__="2.15.0", __file__="fake")
del sys.modules["tf_tempered.keras3"]
try:
    importlib.import_module("tf_tempered.keras3")
    out["keras2_import_error"] = None
except ImportError as e:
    out["keras2_import_error"] = str(e)
finally:
    sys.modules["keras"] = real_keras

print("RESULT:" + json.dumps(out))
'''


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    env = dict(os.environ)
    # A Keras 3 user's process: tf_tempered's bootstrap, not the environment,
    # must bind tf.keras.
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["KERAS_BACKEND"] = "tensorflow"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    proc = subprocess.run([sys.executable, "-c", CHILD_CODE, str(tmp_path_factory.mktemp("k3"))],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                          check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, (
        f"child failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT:"):])


def test_keras3_is_unaffected_by_the_keras2_bootstrap(child):
    assert child["keras_version"].startswith("3.")
    assert child["backend"] == "tensorflow"
    assert child["dense_module"].startswith("keras.src.")
    assert child["tf_keras_name"].startswith("tf_keras")


def test_values_match_numpy(child):
    errors = child["value_errors_in_eps"]
    assert len(errors) == 16
    assert max(errors.values()) <= 4.0, errors
    assert child["default_equals_tanh"] is True


def test_validation_matches_keras2(child):
    messages = child["validation_messages"]
    assert "`scale` must be a finite number > 0, got 0.0" in messages["scale"]
    assert "`inverse_temperature` must be a finite number > 0, got nan" in messages[
        "inverse_temperature"]
    assert "`offset` must be a finite number, got inf" in messages["offset"]
    assert "`learnable` must be a bool, got 'yes'" in messages["learnable"]
    assert all(m.startswith("tf_tempered.keras3.TemperedSigmoid:") for m in messages.values())


def test_config_round_trip(child):
    assert child["config"] == {"scale": 1.5, "inverse_temperature": 3.0, "offset": 0.2,
                               "learnable": True}
    assert child["config_round_trip"] is True
    assert child["deserialized_type"] == "tf_tempered.keras3.TemperedSigmoid"


def test_learnable_weights(child):
    assert child["learnable_initial"] == pytest.approx([1.5, 3.0, 0.2], rel=1e-6)
    assert child["learnable_weight_paths"] == [
        "ts/scale_raw", "ts/inverse_temperature_raw", "ts/offset"]
    assert child["fixed_weights"] == 0
    assert child["floored_scale"] == child["smallest_normal_float32"] > 0
    assert child["mixed_dtypes"] == ["float16", ["float32", "float32", "float32"]]
    assert child["output_shape"] == [None, 3, 5]


def test_model_fits_saves_and_reloads(child):
    assert child["fit_loss_finite"] is True
    assert child["trained_values_moved"] == [True, True, True]
    assert child["reloaded_identical"] is True
    assert child["reloaded_values_identical"] is True
    assert child["reloaded_fn_activation"] is True


def test_non_keras3_gives_import_error_with_fix(child):
    message = child["keras2_import_error"]
    assert message is not None and "needs Keras 3" in message and "2.15.0" in message
    assert "pip install 'keras>=3'" in message
