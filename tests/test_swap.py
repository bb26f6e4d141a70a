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
"""Tests for tf_tempered.swap.swap_activations."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.swap import swap_activations

RNG = np.random.default_rng(0)
L = keras.layers


def _relus(model):
    """Names of every ReLU anywhere in `model`, nested models and inline activations too."""
    found = []
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            found += [f"{layer.name}/{name}" for name in _relus(layer)]
            continue
        activation = getattr(layer, "activation", None)
        if (isinstance(layer, L.ReLU) or isinstance(activation, L.ReLU)
                or activation in (keras.activations.relu, tf.nn.relu)):
            found.append(layer.name)
    return found


def _snapshot(model, x):
    return model.to_json(), [w.copy() for w in model.get_weights()], _outputs(model, x)


def _outputs(model, x):
    return [np.asarray(y) for y in tf.nest.flatten(model(x))]


def _assert_same_outputs(a, b, x):
    for got, want in zip(_outputs(a, x), _outputs(b, x), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _assert_weights_copied(old, new):
    """Every weighted layer of `old` has its weights, unchanged, in `new` under its name."""
    checked = 0
    for layer in old.layers:
        twin = new.get_layer(layer.name)
        if isinstance(layer, keras.Model):
            checked += _assert_weights_copied(layer, twin)
            continue
        for want, got in zip(layer.get_weights(), twin.get_weights()):
            np.testing.assert_array_equal(got, want)
            checked += 1
    return checked


def _randomize(model):
    model.set_weights([RNG.normal(size=w.shape).astype(w.dtype) for w in model.get_weights()])


def _sequential_cnn():
    model = keras.Sequential([
        keras.Input((8, 8, 1)),
        L.Conv2D(4, 3, activation="relu", name="conv1"),
        L.MaxPool2D(2, name="pool"),
        L.Conv2D(4, 3, padding="same", name="conv2"),
        L.ReLU(name="relu2"),
        L.Flatten(name="flatten"),
        L.Dense(8, activation=keras.activations.relu, name="dense"),
        L.Activation("relu", name="relu3"),
        L.Dense(3, name="logits"),
    ], name="cnn")
    _randomize(model)
    return model


def _residual_model():
    inputs = keras.Input((6,), name="x")
    stem = L.Dense(8, activation="relu", name="stem")(inputs)
    branch_a = L.ReLU(name="a_relu")(L.Dense(8, name="a_dense")(stem))
    branch_b = L.Dense(8, activation="relu", name="b_dense")(stem)
    merged = L.Activation("relu", name="merge_relu")(L.Add(name="add")([stem, branch_a, branch_b]))
    logits = L.Dense(2, name="logits")(merged)
    aux = L.Dense(1, activation="sigmoid", name="aux")(branch_b)
    model = keras.Model(inputs, [logits, aux, branch_b], name="residual")
    _randomize(model)
    return model


def _nested_model():
    inner_in = keras.Input((8,))
    h = L.Dense(8, activation="relu", name="inner_dense")(inner_in)
    inner_func = keras.Model(inner_in, L.Add(name="inner_add")([inner_in, h]), name="block")
    inner_seq = keras.Sequential([L.Dense(8, name="seq_dense"), L.ReLU(name="seq_relu")],
                                 name="seq")
    inputs = keras.Input((5,))
    x = L.Dense(8, activation="relu", name="in_dense")(inputs)
    x = inner_seq(x)
    x = inner_func(x)
    x = inner_func(x)  # the same block twice: shared weights
    model = keras.Model(inputs, L.Dense(3, name="logits")(x), name="outer")
    _randomize(model)
    return model


def test_sequential_cnn():
    model = _sequential_cnn()
    x = RNG.normal(size=(4, 8, 8, 1)).astype(np.float32)
    before = _snapshot(model, x)
    assert len(_relus(model)) == 4

    swapped, count = swap_activations(model, "tempered_sigmoid", return_count=True)
    assert count == 4
    assert type(swapped) is keras.Sequential and swapped.name == "cnn"
    assert _relus(swapped) == []
    assert [type(layer).__name__ for layer in swapped.layers] == [
        "Conv2D", "TemperedSigmoid", "MaxPooling2D", "Conv2D", "TemperedSigmoid", "Flatten",
        "Dense", "TemperedSigmoid", "TemperedSigmoid", "Dense"]
    assert [layer.name for layer in swapped.layers][:2] == ["conv1", "conv1_act"]
    assert swapped.get_layer("conv1").activation is keras.activations.linear
    assert swapped.get_layer("relu2").__class__ is TemperedSigmoid
    assert _assert_weights_copied(model, swapped) == 8
    # (2, 2, 1) is tanh.
    _assert_same_outputs(swapped, swap_activations(model, "tanh"), x)
    # Replacing ReLU by ReLU must give the original function back.
    _assert_same_outputs(swap_activations(model, "relu"), model, x)

    after = _snapshot(model, x)
    assert after[0] == before[0]
    for got, want in zip(after[1] + after[2], before[1] + before[2], strict=True):
        np.testing.assert_array_equal(got, want)
    assert len(_relus(model)) == 4


def test_hand_computed_outputs():
    w = np.array([[1.0, -2.0, 0.5], [0.3, 0.7, -1.0]], np.float32)
    b = np.array([0.1, -0.2, 0.05], np.float32)
    model = keras.Sequential([keras.Input((2,)), L.Dense(3, activation="relu")])
    model.layers[0].set_weights([w, b])
    x = np.array([[0.5, -1.0], [2.0, 0.25]], np.float32)
    z = x @ w + b
    np.testing.assert_allclose(swap_activations(model, "tanh")(x), np.tanh(z), rtol=1e-6)
    s, t, o = 1.5, 3.0, 0.5
    np.testing.assert_allclose(swap_activations(model, (s, t, o))(x),
                               s / (1.0 + np.exp(-t * z)) - o, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(x), np.maximum(z, 0.0), rtol=1e-6)


def test_functional_residual_and_branches():
    model = _residual_model()
    x = RNG.normal(size=(5, 6)).astype(np.float32)
    before = _snapshot(model, x)

    swapped, count = swap_activations(model, {"learnable": True}, return_count=True)
    assert count == 4
    assert type(swapped) is type(model) and not isinstance(swapped, keras.Sequential)
    assert _relus(swapped) == []
    acts = [layer for layer in swapped.layers if isinstance(layer, TemperedSigmoid)]
    assert sorted(layer.name for layer in acts) == [
        "a_relu", "b_dense_act", "merge_relu", "stem_act"]
    # Each position has its own learnable (s, T, o).
    assert len({id(v) for layer in acts for v in layer.trainable_weights}) == 12
    assert swapped.count_params() == model.count_params() + 12
    # The sigmoid stays: only 'relu' was asked for.
    assert swapped.get_layer("aux").activation is keras.activations.sigmoid
    assert _assert_weights_copied(model, swapped) == 10
    # The residual Add and the third output now read the new activation's output.
    assert swapped.get_layer("add").input[0] is swapped.get_layer("stem_act").output
    assert swapped.outputs[2] is swapped.get_layer("b_dense_act").output
    _assert_same_outputs(swap_activations(model, "relu"), model, x)
    _assert_same_outputs(swapped, swap_activations(model, "tanh"), x)

    after = _snapshot(model, x)
    assert after[0] == before[0]
    for got, want in zip(after[1] + after[2], before[1] + before[2], strict=True):
        np.testing.assert_array_equal(got, want)


def test_nested_models():
    model = _nested_model()
    x = RNG.normal(size=(3, 5)).astype(np.float32)
    before_json = model.to_json()
    assert sorted(_relus(model)) == ["block/inner_dense", "in_dense", "seq/seq_relu"]

    swapped, count = swap_activations(model, "tempered_sigmoid", return_count=True)
    assert count == 3
    assert _relus(swapped) == []
    seq, block = swapped.get_layer("seq"), swapped.get_layer("block")
    assert type(seq) is keras.Sequential and type(block) is type(model)
    assert [type(layer).__name__ for layer in block.layers] == [
        "InputLayer", "Dense", "TemperedSigmoid", "Add"]
    assert isinstance(seq.get_layer("seq_relu"), TemperedSigmoid)
    assert _assert_weights_copied(model, swapped) == 8
    _assert_same_outputs(swap_activations(model, "relu"), model, x)
    _assert_same_outputs(swapped, swap_activations(model, "tanh"), x)
    assert model.to_json() == before_json
    assert model.get_layer("block") is not block


def test_a_copy_of_nested_models_saves_to_hdf5(tmp_path):
    # Probe T F4 (tf-keras): the layers of a rewritten nested Sequential were built from their
    # build_config outside the model's name scope ("kernel:0"), and the .h5 save of the copy
    # failed ("name already exists").
    encoder = keras.Sequential([keras.Input((5,)), L.Dense(4, activation="relu"), L.Dense(3)],
                               name="encoder")
    model = keras.Sequential([keras.Input((5,)), encoder, L.Dense(2, activation="relu"),
                              L.Dense(3)])
    swapped = swap_activations(model, "tanh")
    x = RNG.normal(size=(3, 5)).astype(np.float32)
    swapped.save_weights(str(tmp_path / "copy.weights.h5"))
    swapped.save(str(tmp_path / "copy.h5"))
    _assert_same_outputs(keras.models.load_model(str(tmp_path / "copy.h5")), swapped, x)


def test_relu6_and_leaky_are_not_relu():
    model = keras.Sequential([
        keras.Input((4,)),
        L.Dense(4, activation="relu6", name="d6"),
        L.ReLU(max_value=6.0, name="relu6"),
        L.ReLU(negative_slope=0.1, name="leaky"),
        L.ReLU(threshold=0.5, name="thresholded"),
        L.LeakyReLU(name="leaky_layer"),
        L.Dense(4, activation="relu", name="d"),
    ])
    swapped, count = swap_activations(model, "tanh", return_count=True)
    assert count == 1
    assert swapped.get_layer("d").activation is keras.activations.linear
    kept = swapped.get_layer("relu6")
    assert type(kept) is L.ReLU and float(kept.max_value) == 6.0
    assert type(swapped.get_layer("leaky")) is L.ReLU
    assert type(swapped.get_layer("thresholded")) is L.ReLU
    assert keras.activations.serialize(swapped.get_layer("d6").activation) == "relu6"

    swapped6, count6 = swap_activations(model, "tanh", replace="relu6", return_count=True)
    assert count6 == 2
    assert type(swapped6.get_layer("relu6")) is L.Activation
    assert swapped6.get_layer("d").activation is keras.activations.relu


def test_replace_several_names_and_inline_hosts():
    model = keras.Sequential([
        keras.Input((3, 2)),
        L.SimpleRNN(4, activation="relu", return_sequences=True, name="rnn"),
        L.ELU(name="elu_layer"),
        L.ELU(alpha=0.5, name="elu_half"),
        L.Flatten(),
        L.Dense(4, activation="elu", name="d_elu"),
        L.Dense(4, activation="selu", name="d_selu"),
    ])
    _randomize(model)
    x = RNG.normal(size=(2, 3, 2)).astype(np.float32)
    swapped, count = swap_activations(model, TemperedSigmoid(learnable=True),
                                      replace=("relu", "elu"), return_count=True)
    assert count == 3
    # A recurrent layer applies its activation inside the loop: it keeps it inline.
    assert isinstance(swapped.get_layer("rnn").activation, TemperedSigmoid)
    assert isinstance(swapped.get_layer("elu_layer"), TemperedSigmoid)
    assert type(swapped.get_layer("elu_half")) is L.ELU
    assert isinstance(swapped.get_layer("d_elu_act"), TemperedSigmoid)
    assert swapped.get_layer("d_selu").activation is keras.activations.selu
    assert _assert_weights_copied(model, swapped) == 7
    _assert_same_outputs(swap_activations(model, "relu", replace="relu"), model, x)
    _assert_same_outputs(swapped, swap_activations(model, "tanh", replace=["relu", "elu"]), x)


@pytest.mark.filterwarnings("ignore:You are saving your model as an HDF5 file")
def test_saves_and_reloads_without_custom_objects(tmp_path):
    model = _residual_model()
    swapped = swap_activations(model, TemperedSigmoid(scale=1.5, learnable=True))
    # Move the learnable parameters off their initial values, so reloading must restore them.
    for layer in swapped.layers:
        if isinstance(layer, TemperedSigmoid):
            for variable in layer.trainable_weights:
                variable.assign(variable + RNG.uniform(0.1, 0.5))
    x = RNG.normal(size=(4, 6)).astype(np.float32)
    for file_name in ("swapped.keras", "swapped.h5"):
        path = str(tmp_path / file_name)
        swapped.save(path)
        loaded = keras.models.load_model(path)
        assert [type(layer).__name__ for layer in loaded.layers] == [
            type(layer).__name__ for layer in swapped.layers]
        _assert_same_outputs(loaded, swapped, x)


def test_result_is_uncompiled_and_count_is_optional():
    model = _sequential_cnn()
    model.compile(optimizer="sgd", loss="mse")
    swapped = swap_activations(model, "tanh")
    assert isinstance(swapped, keras.Sequential)
    # Keras 3 has `compiled` and no optimizer before compile; Keras 2 `_is_compiled`.
    assert getattr(swapped, "optimizer", None) is None
    assert not getattr(swapped, "compiled", getattr(swapped, "_is_compiled", None))
    assert getattr(model, "compiled", getattr(model, "_is_compiled", None)) is True
    assert model.optimizer is not None


def test_unbuilt_sequential():
    model = keras.Sequential([L.Dense(3, activation="relu"), L.Dense(2)])
    swapped, count = swap_activations(model, "tanh", return_count=True)
    assert count == 1 and not swapped.built
    assert swapped(np.ones((1, 4), np.float32)).shape == (1, 2)


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = L.Dense(2, activation="relu")

    def call(self, inputs):
        return self.dense(inputs)


def test_subclassed_models_raise():
    with pytest.raises(TypeError, match="subclassed model.*Functional or Sequential"):
        swap_activations(_Subclassed(), "tanh")
    inputs = keras.Input((3,))
    outer = keras.Model(inputs, _Subclassed()(inputs), name="outer")
    with pytest.raises(TypeError, match="nested model in 'outer'.*is a subclassed model"):
        swap_activations(outer, "tanh")


@pytest.mark.parametrize("replace, match", [
    ((), "non-empty"),
    (None, "non-empty"),
    (("relu", "nope"), "'nope' is not a Keras activation name"),
    ((3,), "3 is not"),
    (("linear",), "may not contain 'linear'"),
])
def test_bad_replace(replace, match):
    model = keras.Sequential([keras.Input((2,)), L.Dense(2, activation="relu")])
    with pytest.raises(ValueError, match=match):
        swap_activations(model, "tanh", replace=replace)


def test_bad_activation_and_model():
    model = keras.Sequential([keras.Input((2,)), L.Dense(2, activation="relu")])
    with pytest.raises(ValueError, match="activation"):
        swap_activations(model, "nope")
    with pytest.raises(TypeError, match="must be a keras.Sequential or Functional"):
        swap_activations(L.Dense(2), "tanh")


def test_new_activation_layers_follow_the_replaced_layer_dtype():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((3,)), L.Dense(4, activation="relu", name="d"),
                                  L.ReLU(name="r"), L.Dense(2, dtype="float32")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    swapped = swap_activations(model, "tempered_sigmoid")
    assert swapped.get_layer("d_act").dtype_policy.name == "mixed_float16"
    assert swapped.get_layer("r").dtype_policy.name == "mixed_float16"
    assert swapped(np.ones((1, 3), np.float32)).dtype == tf.float32


# Before: the copy of a model trained under DP started from ε = 0 once made private (a probe:
# 3.79 logged for weights that had spent 4.70 before the copy).
def test_a_copy_of_a_private_model_goes_on_counting_its_steps():
    from tf_tempered.privacy import epsilon_spent, make_private
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.integers(0, 2, 64)
    model = make_private(keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]),
        l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=8, epochs=2, verbose=0)
    spent = epsilon_spent(model)[0]
    copy = make_private(swap_activations(model, "tanh"))
    assert spent > 1 and epsilon_spent(copy)[0] == pytest.approx(spent)


def test_copies_count_their_own_steps_not_their_sources_or_siblings_later_ones():
    """Probe T F1: a copy shared its source's live ledger, so the steps the source and the
    other copies took after the swap were counted in every ε (an over-count)."""
    from tf_tempered.privacy import epsilon_spent, make_private
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.integers(0, 2, 64)

    def fit(model, epochs=1):
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=epochs, verbose=0)
        return epsilon_spent(model)[0]

    model = make_private(keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]),
        l2_norm_clip=1.0, noise_multiplier=1.0)
    one_epoch = fit(model)
    first, second = swap_activations(model, "tanh"), swap_activations(model, "tanh")
    two_epochs = fit(model)
    assert fit(make_private(first)) == pytest.approx(two_epochs)  # 1 epoch before it, 1 own
    make_private(second)
    assert epsilon_spent(second)[0] == pytest.approx(one_epoch)
    assert epsilon_spent(model)[0] == pytest.approx(two_epochs)


def test_a_copy_of_a_private_model_nesting_an_earlier_one_counts_their_steps_once():
    """Probe T F3: made private, the copy merged its ledger into the one it shared with its
    source, and the source's ε and every later copy's or load's counted 4 epochs for 2."""
    from tf_tempered.privacy import epsilon_spent, make_private
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(64, 3)).astype("float32"), rng.integers(0, 2, 64)

    def trained(model):
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=8, epochs=1, verbose=0)
        return model

    inner = trained(make_private(keras.Sequential([
        keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(2)]),
        l2_norm_clip=1.0, noise_multiplier=1.0))
    outer = trained(make_private(keras.Sequential([keras.Input((3,)), inner,
                                                   keras.layers.Dense(2)]),
                                 l2_norm_clip=1.0, noise_multiplier=1.0))
    two_epochs = epsilon_spent(outer)[0]
    copy = make_private(swap_activations(outer, "tanh"))
    again = make_private(swap_activations(outer, "tanh"))
    assert [epsilon_spent(m)[0] for m in (copy, outer, again)] == pytest.approx([two_epochs] * 3)
