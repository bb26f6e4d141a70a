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
"""Tests of tf_tempered.activations (on the active Keras) against a float64 NumPy reference."""

import math

import numpy as np
import pytest
from scipy.special import expit

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.activations import check_tempered_sigmoid_args
from tf_tempered.activations import inverse_softplus
from tf_tempered.activations import tempered_sigmoid

DTYPES = [tf.float16, tf.bfloat16, tf.float32, tf.float64]
# (s, T, o): tanh, logistic sigmoid, s = 2o but not tanh, and two general ones.
PARAMS = [(2.0, 2.0, 1.0), (1.0, 1.0, 0.0), (3.0, 10.0, 1.5), (1.7, 0.5, 0.3),
          (0.5, 4.0, -2.0)]
X = np.concatenate([np.linspace(-8.0, 8.0, 161), [-1e4, -1e3, -50.0, 50.0, 1e3, 1e4]])


def _eps(dtype):
    # np.finfo does not know bfloat16 (8 significant bits).
    return 2.0 ** -7 if dtype == tf.bfloat16 else float(np.finfo(dtype.as_numpy_dtype).eps)


def _as_float64(tensor):
    return tf.cast(tensor, tf.float64).numpy()


def _reference(x, s, t, o):
    return s * expit(t * x) - o


def _reference_grad(x, s, t, o):
    sig = expit(t * x)
    return s * t * sig * (1.0 - sig)


def _params(p, dtype, as_tensors):
    return [tf.constant(v, dtype) for v in p] if as_tensors else list(p)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["python", "tensors"])
@pytest.mark.parametrize("p", PARAMS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_values_match_numpy_reference(dtype, p, as_tensors):
    x = tf.constant(X, dtype)
    y = tempered_sigmoid(x, *_params(p, dtype, as_tensors))
    assert y.dtype == dtype
    s, t, o = p
    # Compare with the reference at the inputs as rounded to dtype.
    want = _reference(_as_float64(x), s, t, o)
    np.testing.assert_allclose(_as_float64(y), want, rtol=0, atol=4 * _eps(dtype) * (s + abs(o)))


@pytest.mark.parametrize("as_tensors", [False, True], ids=["python", "tensors"])
@pytest.mark.parametrize("p", PARAMS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_gradient_matches_closed_form(dtype, p, as_tensors):
    x = tf.constant(X, dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tempered_sigmoid(x, *_params(p, dtype, as_tensors))
    grad = tape.gradient(y, x)
    assert grad.dtype == dtype
    s, t, o = p
    want = _reference_grad(_as_float64(x), s, t, o)
    np.testing.assert_allclose(_as_float64(grad), want, rtol=0, atol=4 * _eps(dtype) * s * t)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_default_is_exactly_tanh(dtype):
    x = tf.constant(X, dtype)
    np.testing.assert_array_equal(_as_float64(tempered_sigmoid(x)), _as_float64(tf.tanh(x)))
    np.testing.assert_array_equal(_as_float64(tempered_sigmoid(x, 2, 2, 1)),
                                  _as_float64(tf.tanh(x)))


def test_tanh_form_has_no_cancellation_near_zero():
    # s·σ(Tx) - o would round 2·σ(2e-9) - 1 to 0 in float32.
    x = tf.constant([1e-9, -3e-8], tf.float32)
    np.testing.assert_allclose(tempered_sigmoid(x).numpy(), [1e-9, -3e-8], rtol=1e-6)


@pytest.mark.parametrize("as_tensors", [False, True], ids=["python", "tensors"])
@pytest.mark.parametrize("p", PARAMS + [(4.0, 100.0, 0.5)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_extremes_are_finite_and_saturate(dtype, p, as_tensors):
    x = tf.constant([-1e4, -1e3, -300.0, 300.0, 1e3, 1e4], dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = tempered_sigmoid(x, *_params(p, dtype, as_tensors))
    grad = _as_float64(tape.gradient(y, x))
    y = _as_float64(y)
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(grad))
    s, t, o = p
    tol = 4 * _eps(dtype) * (s + abs(o))
    np.testing.assert_allclose(y[:3], -o, rtol=0, atol=tol)
    np.testing.assert_allclose(y[3:], s - o, rtol=0, atol=tol)
    np.testing.assert_allclose(grad, 0.0, rtol=0, atol=_eps(dtype) * s * t)


def test_integer_input_becomes_floatx():
    y = tempered_sigmoid(tf.constant([-1, 0, 2]))
    assert y.dtype == tf.float32
    np.testing.assert_allclose(y.numpy(), np.tanh([-1.0, 0.0, 2.0]), rtol=1e-6)


def test_variable_parameters_are_differentiable():
    s, t, o = (tf.Variable(1.5, dtype=tf.float64), tf.Variable(3.0, dtype=tf.float64),
               tf.Variable(0.25, dtype=tf.float64))
    x = tf.constant([-0.4, 0.1, 0.7], tf.float64)
    with tf.GradientTape() as tape:
        y = tf.reduce_sum(tempered_sigmoid(x, s, t, o))
    ds, dt, do = tape.gradient(y, [s, t, o])
    sig = expit(3.0 * x.numpy())
    np.testing.assert_allclose(ds.numpy(), np.sum(sig), rtol=1e-12)
    np.testing.assert_allclose(dt.numpy(), np.sum(1.5 * x.numpy() * sig * (1 - sig)), rtol=1e-12)
    np.testing.assert_allclose(do.numpy(), -3.0, rtol=1e-12)


@pytest.mark.parametrize("name, value", [
    ("scale", 0.0), ("scale", -1.0), ("scale", float("nan")), ("scale", float("inf")),
    ("scale", "2"), ("scale", None), ("scale", True),
    ("inverse_temperature", 0), ("inverse_temperature", -2.0),
    ("inverse_temperature", float("inf")), ("inverse_temperature", float("nan")),
    ("offset", float("inf")), ("offset", float("-inf")), ("offset", float("nan")),
    ("offset", "1"), pytest.param("scale", 10 ** 400, id="scale-int_beyond_float"),
])
def test_invalid_arguments_raise_value_error_naming_them(name, value):
    kwargs = {"scale": 2.0, "inverse_temperature": 2.0, "offset": 1.0, name: value}
    with pytest.raises(ValueError, match=f"`{name}`") as info:
        tempered_sigmoid(tf.zeros(3), **kwargs)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        got = f"{value!r} ({type(value).__name__})"
    else:
        got = "inf" if value == 10 ** 400 else repr(float(value))
    assert f"got {got}." in str(info.value)
    assert "Fix:" in str(info.value)


def test_valid_edge_arguments_are_accepted():
    assert check_tempered_sigmoid_args(1e-6, 1e6, -5) == (1e-6, 1e6, -5.0)
    assert check_tempered_sigmoid_args(np.float32(2.0), np.int64(2), 1) == (2.0, 2.0, 1.0)
    tensors = (tf.constant(2.0), tf.Variable(2.0), tf.constant(1.0))
    assert check_tempered_sigmoid_args(*tensors, allow_tensors=True) == tensors


@pytest.mark.parametrize("learnable", [1, "True", None, 0.0])
def test_learnable_must_be_bool(learnable):
    assert check_tempered_sigmoid_args(2, 2, 1, learnable=True) == (2.0, 2.0, 1.0)
    assert check_tempered_sigmoid_args(2, 2, 1, learnable=np.bool_(False)) == (2.0, 2.0, 1.0)
    with pytest.raises(ValueError, match="`learnable` must be a bool, got " + repr(learnable)):
        check_tempered_sigmoid_args(2, 2, 1, learnable=learnable)


def test_tensors_rejected_unless_allowed():
    with pytest.raises(ValueError, match="`scale`"):
        check_tempered_sigmoid_args(tf.constant(2.0), 2.0, 1.0)


@pytest.mark.parametrize("y", [1e-30, 1e-6, 0.3, 2.0, 20.0, 1e4, 1e300])
def test_inverse_softplus_round_trips(y):
    x = inverse_softplus(y)
    assert math.isfinite(x)
    np.testing.assert_allclose(np.logaddexp(0.0, x), y, rtol=1e-13)


@pytest.mark.parametrize("y", [0.0, -1.0, float("nan")])
def test_inverse_softplus_rejects_non_positive(y):
    with pytest.raises(ValueError, match="`y` must be > 0"):
        inverse_softplus(y)


def test_string_activation_resolves():
    assert keras.activations.get("tempered_sigmoid") is tempered_sigmoid
    assert keras.saving.get_registered_object("tf_tempered>tempered_sigmoid") is tempered_sigmoid
    assert keras.saving.get_registered_name(tempered_sigmoid) == "tf_tempered>tempered_sigmoid"
    if KERAS_MAJOR == 2:  # Keras 3 resolves registered names in configs, not in get()
        assert keras.activations.get("tf_tempered>tempered_sigmoid") is tempered_sigmoid
    dense = keras.layers.Dense(4, activation="tempered_sigmoid")
    assert dense.activation is tempered_sigmoid
    x = np.random.RandomState(0).randn(5, 3).astype(np.float32)
    y = dense(x).numpy()
    kernel, bias = dense.get_weights()
    np.testing.assert_allclose(y, np.tanh(x @ kernel + bias), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(keras.layers.Activation("tempered_sigmoid")(x).numpy(),
                                  tf.tanh(x).numpy())


# Not HDF5: tf-keras 2.21 saves any custom *function* activation in a form its own
# HDF5 loader cannot read back; TemperedSigmoid layers as activations do reload
# from HDF5 (tests/test_layers.py).
@pytest.mark.parametrize("fmt", ["keras"])
def test_model_with_string_activation_saves_and_loads(tmp_path, fmt):
    inputs = keras.Input((3,))
    hidden = keras.layers.Dense(4, activation="tempered_sigmoid")(inputs)
    hidden = keras.layers.Dense(4, activation=tempered_sigmoid)(hidden)
    model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
    x = np.random.RandomState(1).randn(6, 3).astype(np.float32)
    path = str(tmp_path / f"model.{fmt}")
    model.save(path)
    loaded = keras.models.load_model(path)  # no custom_objects
    assert loaded.layers[1].activation is tempered_sigmoid
    assert loaded.layers[2].activation is tempered_sigmoid
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))
