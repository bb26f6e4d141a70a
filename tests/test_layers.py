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
"""Tests of tf_tempered.layers: TemperedSigmoid and WeightStandardizedConv2D."""

import numpy as np
import pytest
from scipy.special import expit

from tf_tempered._compat import keras, tf
from tf_tempered.activations import smallest_normal
from tf_tempered.layers import TemperedSigmoid, WeightStandardizedConv2D

RNG = np.random.RandomState(0)
X = RNG.randn(6, 3).astype(np.float32)
P = (1.5, 3.0, 0.2)


def _reference(x, s, t, o):
    return s * expit(t * np.asarray(x, np.float64)) - o


def _values(layer):
    return np.array([float(layer.scale), float(layer.inverse_temperature), float(layer.offset)])


@pytest.mark.parametrize("name, value", [
    ("scale", 0.0), ("scale", -2.0), ("scale", float("nan")), ("scale", float("inf")),
    ("scale", "2.0"), ("scale", None),
    ("inverse_temperature", 0.0), ("inverse_temperature", -1.0),
    ("inverse_temperature", float("inf")),
    ("offset", float("nan")), ("offset", float("-inf")), ("offset", [1.0]),
    ("learnable", 1), ("learnable", "False"), ("learnable", None),
])
def test_invalid_arguments_raise_value_error(name, value):
    with pytest.raises(ValueError, match=f"TemperedSigmoid: `{name}`") as info:
        TemperedSigmoid(**{name: value})
    assert f"got {value!r}" in str(info.value) and "Fix: pass" in str(info.value)


def test_fixed_layer_matches_reference_and_has_no_weights():
    layer = TemperedSigmoid(*P)
    y = layer(X)
    np.testing.assert_allclose(y.numpy(), _reference(X, *P), rtol=1e-6, atol=1e-6)
    assert layer.weights == []
    assert (layer.scale, layer.inverse_temperature, layer.offset) == P


def test_default_layer_is_tanh():
    np.testing.assert_array_equal(TemperedSigmoid()(X).numpy(), tf.tanh(X).numpy())


@pytest.mark.parametrize("learnable", [False, True])
def test_config_round_trip(learnable):
    layer = TemperedSigmoid(*P, learnable=learnable, name="ts")
    config = layer.get_config()
    assert {k: config[k] for k in ("scale", "inverse_temperature", "offset", "learnable")} == {
        "scale": 1.5, "inverse_temperature": 3.0, "offset": 0.2, "learnable": learnable}
    clone = TemperedSigmoid.from_config(config)
    assert clone.get_config() == config
    np.testing.assert_array_equal(clone(X).numpy(), layer(X).numpy())
    # Registered: generic deserialization needs no custom_objects.
    revived = keras.layers.deserialize(keras.layers.serialize(layer))
    assert isinstance(revived, TemperedSigmoid) and revived.get_config() == config


@pytest.mark.parametrize("p", [P, (2.0, 2.0, 1.0), (1e-3, 1e-2, -4.0), (1e4, 50.0, 3.0),
                               (25.0, 1e3, 0.0)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_learnable_weights_start_at_the_given_values(p, dtype):
    layer = TemperedSigmoid(*p, learnable=True, dtype=dtype)
    y = layer(X)
    # Keras 2 names them "<layer>/scale_raw:0", Keras 3 "scale_raw".
    assert [w.name.split("/")[-1].split(":")[0] for w in layer.trainable_weights] == [
        "scale_raw", "inverse_temperature_raw", "offset"]
    assert all(w.shape == () and w.dtype == dtype for w in layer.trainable_weights)
    rtol = 1e-6 if dtype == "float32" else 1e-14
    np.testing.assert_allclose(_values(layer), p, rtol=rtol)
    np.testing.assert_allclose(y.numpy(), _reference(X, *p), rtol=2 * rtol,
                               atol=2 * rtol * (p[0] + abs(p[2])))


def test_learnable_weights_are_trained_by_fit():
    inputs = keras.Input((3,))
    layer = TemperedSigmoid(*P, learnable=True)
    model = keras.Model(inputs, keras.layers.Dense(1)(layer(keras.layers.Dense(4)(inputs))))
    model.compile(keras.optimizers.SGD(0.1), "mse")
    model.fit(X, np.ones((6, 1)), batch_size=6, epochs=1, verbose=0)
    changed = np.abs(_values(layer) - np.array(P))
    assert np.all(changed > 1e-6), changed


def test_scale_and_temperature_stay_positive_after_a_large_step():
    layer = TemperedSigmoid(learnable=True)
    x = tf.constant(np.abs(X) + 0.5)
    optimizer = keras.optimizers.SGD(0.1)
    with tf.GradientTape() as tape:
        loss = 100.0 * tf.reduce_sum(layer(x))
    grads = tape.gradient(loss, layer.trainable_weights)
    # dloss/ds and dloss/dT: the step a direct (s, T) parametrization would take.
    sig = expit(2.0 * x.numpy())
    ds = 100.0 * np.sum(sig)
    dt = 100.0 * np.sum(2.0 * x.numpy() * sig * (1 - sig))
    assert 2.0 - 0.1 * ds < 0 and 2.0 - 0.1 * dt < 0  # the step is large enough to matter
    optimizer.apply_gradients(zip(grads, layer.trainable_weights))
    # softplus(ρ_s) underflows to 0 here; the floor keeps s strictly positive.
    assert float(tf.nn.softplus(layer.trainable_weights[0])) == 0.0
    s, t, o = _values(layer)
    assert s == smallest_normal("float32") and 0 < t < 1.5 and o > 1.0
    y = layer(x).numpy()
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y, s * expit(t * x.numpy()) - o, rtol=1e-6)


@pytest.mark.parametrize("policy, compute", [("mixed_float16", tf.float16),
                                             ("mixed_bfloat16", tf.bfloat16),
                                             ("float64", tf.float64)])
@pytest.mark.parametrize("learnable", [False, True])
def test_dtype_policies(policy, compute, learnable):
    layer = TemperedSigmoid(*P, learnable=learnable, dtype=policy)
    y = layer(X)
    assert y.dtype == compute and layer.compute_dtype == compute.name
    want_var = "float64" if policy == "float64" else "float32"
    assert all(w.dtype == want_var for w in layer.weights)
    atol = {tf.float16: 4e-3, tf.bfloat16: 4e-2, tf.float64: 1e-12}[compute]
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), _reference(X, *P), atol=atol)


def test_compute_output_shape_is_identity():
    layer = TemperedSigmoid(learnable=True)
    assert tuple(layer.compute_output_shape(tf.TensorShape((None, 3, 5)))) == (None, 3, 5)
    assert layer(tf.zeros((2, 3, 5))).shape == (2, 3, 5)


@pytest.mark.parametrize("learnable", [False, True])
def test_call_is_per_example(learnable):
    layer = TemperedSigmoid(*P, learnable=learnable)
    x = tf.constant(X)
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
    jacobian = tape.jacobian(y, x).numpy()  # (batch, 3, batch, 3)
    for i in range(X.shape[0]):
        for j in range(X.shape[0]):
            if i != j:
                np.testing.assert_array_equal(jacobian[i, :, j, :], 0.0)
    # Equal up to rounding: vectorized and scalar kernels may differ by an ulp.
    single = np.concatenate([layer(X[i:i + 1]).numpy() for i in range(X.shape[0])])
    np.testing.assert_allclose(single, y.numpy(), rtol=1e-6)


def test_drop_in_activation_layer_and_dense_activation():
    dense = keras.layers.Dense(4)
    separate = TemperedSigmoid()(dense(X)).numpy()
    fused = keras.layers.Dense(4, activation=TemperedSigmoid())
    fused.build((None, 3))
    fused.set_weights(dense.get_weights())
    np.testing.assert_array_equal(fused(X).numpy(), separate)
    np.testing.assert_array_equal(separate, keras.layers.Activation("tanh")(dense(X)).numpy())
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), TemperedSigmoid(*P)])
    model.layers[0].set_weights(dense.get_weights())
    np.testing.assert_allclose(model(X).numpy(), _reference(dense(X).numpy(), *P), atol=1e-6)


def test_learnable_dense_activation_weights_belong_to_dense():
    dense = keras.layers.Dense(4, activation=TemperedSigmoid(*P, learnable=True))
    dense(X)
    assert len(dense.trainable_weights) == 5  # kernel, bias, s, T, o


def _build_model(where, learnable):
    inputs = keras.Input((3,))
    if where == "layer":
        hidden = TemperedSigmoid(*P, learnable=learnable)(keras.layers.Dense(4)(inputs))
    else:
        hidden = keras.layers.Dense(
            4, activation=TemperedSigmoid(*P, learnable=learnable))(inputs)
    return keras.Model(inputs, keras.layers.Dense(2)(hidden))


def _find_tempered(model):
    for layer in model.layers:
        if isinstance(layer, TemperedSigmoid):
            return layer
        if isinstance(getattr(layer, "activation", None), TemperedSigmoid):
            return layer.activation
    raise AssertionError("no TemperedSigmoid in the model")


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
@pytest.mark.parametrize("fmt", ["keras", "h5"])
@pytest.mark.parametrize("learnable", [False, True])
@pytest.mark.parametrize("where", ["layer", "dense_activation"])
def test_save_and_load_without_custom_objects(tmp_path, fmt, learnable, where):
    model = _build_model(where, learnable)
    tempered = _find_tempered(model)
    if learnable:
        # Move (s, T, o) away from the config's initial values, so only restored
        # weights can reproduce the outputs.
        for weight, value in zip(tempered.trainable_weights, (0.3, -0.4, 0.7)):
            weight.assign(value)
    path = str(tmp_path / f"model.{fmt}")
    model.save(path)
    loaded = keras.models.load_model(path)
    revived = _find_tempered(loaded)
    assert revived.get_config()["learnable"] == learnable
    np.testing.assert_array_equal(_values(revived), _values(tempered))
    np.testing.assert_array_equal(loaded.predict(X, verbose=0), model.predict(X, verbose=0))


# WeightStandardizedConv2D

IMAGES = RNG.randn(2, 5, 6, 3)


def _standardized_reference(v, eps):
    """Ŵ in NumPy (float64): per output channel over (kh, kw, cin)."""
    v = np.asarray(v, np.float64)
    return (v - v.mean((0, 1, 2))) / np.sqrt(v.var((0, 1, 2)) + eps)


def _valid_conv_reference(x, w):
    """A stride-1 "valid" convolution in NumPy: every output pixel's patch times w."""
    kh, kw = w.shape[:2]
    patches = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    return np.einsum("bhwcij,ijcf->bhwf", patches, w)  # patches: [B, oh, ow, cin, kh, kw]


@pytest.mark.parametrize("eps", [1e-5, 0.3])
def test_weight_standardized_conv2d_matches_numpy(eps):
    layer = WeightStandardizedConv2D(4, (2, 3), epsilon=eps, activation="tanh",
                                     bias_initializer="random_normal", dtype="float64")
    layer.build(IMAGES.shape)
    # Off-center, unequal channels: the mean and the scale of each channel both matter.
    kernel = RNG.randn(*layer.kernel.shape) * [0.1, 1.0, 3.0, 0.02] + [0.5, -1.0, 0.0, 2.0]
    layer.kernel.assign(kernel)
    w_hat = _standardized_reference(kernel, eps)
    want = np.tanh(_valid_conv_reference(IMAGES, w_hat) + layer.bias.numpy())
    np.testing.assert_allclose(layer(IMAGES).numpy(), want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.standardized_kernel().numpy(), w_hat, rtol=1e-12)
    # A plain Conv2D with Ŵ for kernel computes the same (strides, padding as Conv2D's).
    strided = WeightStandardizedConv2D(4, 3, strides=2, padding="same", epsilon=eps,
                                       dtype="float64")
    plain = keras.layers.Conv2D(4, 3, strides=2, padding="same", dtype="float64")
    strided.build(IMAGES.shape)
    plain.build(IMAGES.shape)
    plain.set_weights([_standardized_reference(strided.kernel.numpy(), eps),
                       strided.bias.numpy()])
    np.testing.assert_allclose(strided(IMAGES).numpy(), plain(IMAGES).numpy(), rtol=1e-12,
                               atol=1e-13)


def test_scaled_weight_standardization_divides_by_the_fan_in():
    layer = WeightStandardizedConv2D(4, (2, 3), epsilon=1e-5, scaled=True, dtype="float64")
    layer.build(IMAGES.shape)
    assert layer.gain() == pytest.approx(1 / np.sqrt(2 * 3 * 3))
    w = _standardized_reference(layer.kernel.numpy(), 1e-5) / np.sqrt(18)
    np.testing.assert_allclose(layer(IMAGES).numpy(), _valid_conv_reference(IMAGES, w)
                               + layer.bias.numpy(), rtol=1e-12, atol=1e-12)
    # Unit-variance inputs keep (about) unit variance: what a tanh after it needs.
    x = np.random.default_rng(0).normal(size=(64, 12, 12, 3))
    assert 0.5 < float(np.var(layer(x).numpy())) < 2.0
    assert float(np.var(WeightStandardizedConv2D(4, (2, 3), dtype="float64")(x).numpy())) > 9
    with pytest.raises(ValueError, match="`scaled` must be True or False, got 1"):
        WeightStandardizedConv2D(4, 3, scaled=1)
    config = layer.get_config()
    assert config["scaled"] is True and WeightStandardizedConv2D.from_config(config).scaled


def test_weight_standardized_conv2d_mixed_precision():
    layer = WeightStandardizedConv2D(4, 3, dtype="mixed_float16")
    y = layer(IMAGES.astype("float32"))
    assert y.dtype == tf.float16 and layer.kernel.dtype == "float32"
    want = _valid_conv_reference(IMAGES, _standardized_reference(layer.kernel.numpy(), 1e-5))
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), want, atol=0.05)


@pytest.mark.parametrize("value", [0, 0.0, -1e-5, float("nan"), float("inf"), "1e-5", None,
                                   True, [1e-5]])
def test_weight_standardized_conv2d_rejects_bad_epsilon(value):
    with pytest.raises(ValueError, match="WeightStandardizedConv2D: `epsilon` must be") as info:
        WeightStandardizedConv2D(4, 3, epsilon=value)
    assert f"got {value!r}" in str(info.value) and "Fix: pass" in str(info.value)


def test_weight_standardized_conv2d_config_round_trip():
    layer = WeightStandardizedConv2D(4, 3, strides=2, epsilon=1e-3, name="ws")
    config = layer.get_config()
    assert config["epsilon"] == 1e-3 and config["strides"] in ((2, 2), [2, 2])
    clone = WeightStandardizedConv2D.from_config(config)
    assert clone.epsilon == 1e-3 and clone.get_config() == config
    revived = keras.layers.deserialize(keras.layers.serialize(layer))  # no custom_objects
    assert type(revived) is WeightStandardizedConv2D and revived.get_config() == config


def test_weight_standardized_conv2d_saves_and_loads(tmp_path):
    model = keras.Sequential([keras.Input(IMAGES.shape[1:]),
                              WeightStandardizedConv2D(4, 3, epsilon=0.3, name="ws"),
                              keras.layers.GroupNormalization(groups=2),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    # Not a standardized kernel, so only the saved V (and ε) reproduce the outputs.
    model.get_layer("ws").kernel.assign(RNG.randn(3, 3, 3, 4) * 2.0 + 1.0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    revived = loaded.get_layer("ws")
    assert type(revived) is WeightStandardizedConv2D and revived.epsilon == 0.3
    np.testing.assert_array_equal(revived.kernel.numpy(), model.get_layer("ws").kernel.numpy())
    x = IMAGES.astype("float32")
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0),
                               rtol=1e-6, atol=1e-6)
