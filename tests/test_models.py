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
"""Tests for tf_tempered.models: the paper's CNNs and resolve_activation."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.models import cifar10_cnn, mnist_cnn, resolve_activation
from tf_tempered.privacy import is_private, make_private

# Parameter counts worked out by hand: (kh·kw·c_in + 1)·c_out for a conv,
# (d_in + 1)·d_out for a dense.
MNIST_EXPECTED = [  # (layer type, params, output shape) on 28×28×1, 10 classes
    ("InputLayer", 0, (None, 28, 28, 1)),
    ("Conv2D", (8 * 8 * 1 + 1) * 16, (None, 14, 14, 16)),  # 1040; 'same', stride 2
    ("act", 0, (None, 14, 14, 16)),
    ("MaxPooling2D", 0, (None, 13, 13, 16)),  # 2×2, stride 1
    ("Conv2D", (4 * 4 * 16 + 1) * 32, (None, 5, 5, 32)),  # 8224; (13 - 4) // 2 + 1 = 5
    ("act", 0, (None, 5, 5, 32)),
    ("MaxPooling2D", 0, (None, 4, 4, 32)),
    ("Flatten", 0, (None, 512)),
    ("Dense", (512 + 1) * 32, (None, 32)),  # 16416
    ("act", 0, (None, 32)),
    ("Dense", (32 + 1) * 10, (None, 10)),  # 330
]

CIFAR_EXPECTED = [  # on 32×32×3, 10 classes
    ("InputLayer", 0, (None, 32, 32, 3)),
    ("Conv2D", 896, (None, 32, 32, 32)), ("act", 0, (None, 32, 32, 32)),
    ("Conv2D", 9248, (None, 32, 32, 32)), ("act", 0, (None, 32, 32, 32)),
    ("AveragePooling2D", 0, (None, 16, 16, 32)),
    ("Conv2D", 18496, (None, 16, 16, 64)), ("act", 0, (None, 16, 16, 64)),
    ("Conv2D", 36928, (None, 16, 16, 64)), ("act", 0, (None, 16, 16, 64)),
    ("AveragePooling2D", 0, (None, 8, 8, 64)),
    ("Conv2D", 73856, (None, 8, 8, 128)), ("act", 0, (None, 8, 8, 128)),
    ("Conv2D", 147584, (None, 8, 8, 128)), ("act", 0, (None, 8, 8, 128)),
    ("AveragePooling2D", 0, (None, 4, 4, 128)),
    ("Conv2D", 295168, (None, 4, 4, 256)), ("act", 0, (None, 4, 4, 256)),
    ("Conv2D", 23050, (None, 4, 4, 10)),
    ("GlobalAveragePooling2D", 0, (None, 10)),
]

# activation spec -> (activation layer type, params per activation layer)
ACTIVATION_FORMS = {
    "tempered_sigmoid": ("TemperedSigmoid", 0),
    "relu": ("Activation", 0),
    "tanh": ("Activation", 0),
    "tuple": ("TemperedSigmoid", 0),
    "dict_learnable": ("TemperedSigmoid", 3),
    "layer_instance": ("TemperedSigmoid", 3),
}


def _spec(form):
    if form == "tuple":
        return (1.5, 3.0, 0.5)
    if form == "dict_learnable":
        return {"scale": 1.5, "learnable": True}
    if form == "layer_instance":
        return TemperedSigmoid(scale=1.5, inverse_temperature=3.0, offset=0.5, learnable=True)
    return form


def _check_layers(model, expected, act_type, act_params):
    rows = [(type(layer).__name__, layer.count_params(), tuple(layer.output.shape))
            for layer in model.layers]
    want = [(act_type if kind == "act" else kind,
             act_params if kind == "act" else params, shape)
            for kind, params, shape in expected]
    assert rows == want
    return sum(params for _, params, _ in want)


@pytest.mark.parametrize("form", sorted(ACTIVATION_FORMS))
def test_mnist_cnn_layers_for_each_activation_form(form):
    act_type, act_params = ACTIVATION_FORMS[form]
    model = mnist_cnn(_spec(form))
    total = _check_layers(model, MNIST_EXPECTED, act_type, act_params)
    assert total == 26010 + 3 * act_params
    assert model.count_params() == total
    assert isinstance(model, keras.Model) and not isinstance(model, keras.Sequential)
    assert len(model.inputs) == 1 and len(model.outputs) == 1
    assert model.name == "mnist_cnn"
    # Logits: the last layer applies no activation.
    assert model.layers[-1].activation is keras.activations.linear


@pytest.mark.parametrize("form", ["tempered_sigmoid", "dict_learnable"])
def test_cifar10_cnn_layers(form):
    act_type, act_params = ACTIVATION_FORMS[form]
    model = cifar10_cnn(_spec(form))
    total = _check_layers(model, CIFAR_EXPECTED, act_type, act_params)
    assert 896 + 9248 + 18496 + 36928 + 73856 + 147584 + 295168 + 23050 == 605226
    assert total == 605226 + 7 * act_params
    assert model.count_params() == total
    assert model.layers[-2].activation is keras.activations.linear
    logits = model(np.zeros((2, 32, 32, 3), np.float32))
    assert logits.shape == (2, 10)


def test_activation_layers_are_distinct_instances_with_their_own_weights():
    spec = TemperedSigmoid(learnable=True)
    model = cifar10_cnn(spec)
    acts = [layer for layer in model.layers if isinstance(layer, TemperedSigmoid)]
    assert len(acts) == 7
    assert len({id(layer) for layer in acts}) == 7
    assert spec not in model.layers
    variables = [v for layer in acts for v in layer.trainable_weights]
    assert len(variables) == 21 and len({id(v) for v in variables}) == 21
    # Training one position must not move another's parameters.
    acts[0].trainable_weights[0].assign(5.0)
    assert float(acts[1].trainable_weights[0]) != 5.0
    assert len({layer.name for layer in model.layers}) == len(model.layers)


def test_mnist_cnn_other_shapes_and_classes():
    model = mnist_cnn("relu", input_shape=(20, 20, 3), num_classes=7, name="small")
    # 20 -> 10 ('same', stride 2) -> 9 (pool) -> (9 - 4) // 2 + 1 = 3 -> 2 (pool)
    assert [layer.count_params() for layer in model.layers if layer.count_params()] == [
        (8 * 8 * 3 + 1) * 16, (4 * 4 * 16 + 1) * 32, (2 * 2 * 32 + 1) * 32, (32 + 1) * 7]
    assert model.output_shape == (None, 7)
    assert model.name == "small"
    smallest = mnist_cnn(input_shape=(13, 13, 1))
    assert tuple(smallest.get_layer("flatten").output.shape) == (None, 32)


def test_tempered_sigmoid_default_is_tanh_model():
    ts_model = mnist_cnn("tempered_sigmoid")
    tanh_model = mnist_cnn("tanh")
    tanh_model.set_weights(ts_model.get_weights())
    x = np.random.default_rng(0).normal(size=(3, 28, 28, 1)).astype(np.float32)
    np.testing.assert_allclose(ts_model(x), tanh_model(x), rtol=1e-5, atol=1e-6)
    relu_model = mnist_cnn("relu")
    relu_model.set_weights(ts_model.get_weights())
    assert not np.allclose(relu_model(x), ts_model(x))


def test_resolve_activation_forms():
    make = resolve_activation((1.5, 3.0, 0.5))
    first, second = make(), make()
    assert first is not second and first.name != second.name
    assert (first.scale, first.inverse_temperature, first.offset) == (1.5, 3.0, 0.5)
    assert first.learnable is False
    layer = resolve_activation({"offset": 0.25, "learnable": True})()
    assert (layer.scale, layer.inverse_temperature, layer.offset) == (2.0, 2.0, 0.25)
    assert layer.learnable is True
    relu = resolve_activation("relu")()
    assert isinstance(relu, keras.layers.Activation)
    np.testing.assert_array_equal(relu(tf.constant([-1.0, 2.0])), [0.0, 2.0])
    named = TemperedSigmoid(scale=3.0, name="mine")
    clone = resolve_activation(named)()
    assert clone is not named and clone.name != "mine" and clone.scale == 3.0
    relu_layer = resolve_activation(keras.layers.ReLU(max_value=6.0))()
    np.testing.assert_array_equal(relu_layer(tf.constant([-1.0, 9.0])), [0.0, 6.0])


@pytest.mark.parametrize("bad, match", [
    ("nope", "not a known activation name"),
    ("Relu", "not a known activation name"),
    ((1.0, 2.0), "3 numbers"),
    ([1.0, 2.0, 3.0, 4.0], "3 numbers"),
    ((1.0, -2.0, 0.0), "inverse_temperature"),
    ((0.0, 2.0, 1.0), "scale"),
    ({"scale": 1.0, "temperature": 2.0}, "unknown keys"),
    ({"learnable": "yes"}, "learnable"),
    (42, "unsupported type int"),
    (None, "unsupported type NoneType"),
])
def test_resolve_activation_rejects_bad_values(bad, match):
    with pytest.raises(ValueError, match=match) as info:
        resolve_activation(bad)
    assert "activation" in str(info.value)


def test_resolve_activation_rejects_models():
    with pytest.raises(ValueError, match="not a model"):
        resolve_activation(keras.Sequential([keras.layers.ReLU()]))


@pytest.mark.parametrize("kwargs, match", [
    ({"input_shape": (28, 28)}, "input_shape"),
    ({"input_shape": (0, 28, 1)}, "input_shape"),
    ({"input_shape": (28.0, 28, 1)}, "input_shape"),
    ({"input_shape": "28x28"}, "input_shape"),
    ({"input_shape": (12, 28, 1)}, r"too small: its height 12 .* at least 13×13"),
    ({"input_shape": (28, 10, 1)}, "its width 10"),
    ({"num_classes": 0}, "num_classes"),
    ({"num_classes": True}, "num_classes"),
    ({"num_classes": 2.5}, "num_classes"),
    ({"name": ""}, "name"),
    ({"activation": "nope"}, "activation"),
])
def test_mnist_cnn_rejects_bad_args(kwargs, match):
    with pytest.raises(ValueError, match=match):
        mnist_cnn(**kwargs)


def test_cifar10_cnn_rejects_bad_args():
    with pytest.raises(ValueError, match=r"cifar10_cnn: .*at least 8×8"):
        cifar10_cnn(input_shape=(7, 32, 3))
    with pytest.raises(ValueError, match="num_classes"):
        cifar10_cnn(num_classes=-1)
    assert cifar10_cnn(input_shape=(8, 8, 1)).output_shape == (None, 10)


@pytest.mark.parametrize("builder", [mnist_cnn, cifar10_cnn])
def test_builders_return_plain_models(builder):
    model = builder("tanh")
    assert not is_private(model)
    assert getattr(model, "optimizer", None) is None


def test_make_private_on_a_built_cnn_without_noise_or_clipping_is_plain_sgd():
    # σ = 0 and a clip no gradient reaches: DP-SGD's mean of clipped per-example
    # gradients is the mean gradient, so one step equals one plain SGD step.
    x = np.random.default_rng(1).normal(size=(4, 13, 13, 1)).astype(np.float32)
    y = np.array([0, 1, 2, 1])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    plain = mnist_cnn((1.5, 3.0, 0.5), input_shape=(13, 13, 1), num_classes=3)
    private = mnist_cnn((1.5, 3.0, 0.5), input_shape=(13, 13, 1), num_classes=3)
    private.set_weights(plain.get_weights())
    assert make_private(private, l2_norm_clip=1e6, noise_multiplier=0.0) is private
    plain.compile(keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True))
    private.compile(keras.optimizers.SGD(0.5), loss=loss)
    start = [w.copy() for w in plain.get_weights()]
    plain.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    private.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
    assert not np.allclose(plain.get_weights()[0], start[0])  # the step did move them
    for got, want in zip(private.get_weights(), plain.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
