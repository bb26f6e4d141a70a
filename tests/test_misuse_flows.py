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
"""Misuse tests, Keras flows: saving and loading, unfreezing, XLA, mixed precision,
layers called on several tensors, activity regularizers, microbatches with a short batch.

Each flow either trains with the exact DP update (checked against a float64 per-example
reference, dp_reference.py) or is refused before any update, naming the fix.
"""

import warnings

import numpy as np
import pytest

from dp_reference import assert_update, engine_update, median_clip, per_example_reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import (EngineOptions, NotPrivateError, epsilon_spent, is_private,
                                 layer_paths, make_private)
from tf_tempered.privacy.state import get_state

pytestmark = pytest.mark.filterwarnings("ignore:noise_multiplier=0")

ROWS = 12


def _sce(y, p, model):
    del model
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True))


LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _data(shape=(5,), seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(ROWS,) + shape).astype(np.float32), rng.integers(0, 3, ROWS)


def _mlp(dtype="float32"):
    return keras.Sequential([keras.Input((5,), dtype=dtype),
                             keras.layers.Dense(6, activation="tanh", dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


# Keras 3's legacy H5 loading gives an optimizer it cannot train, private or not
# ("Unknown variable"): the .keras format there; tf-keras also saves H5 and SavedModel.
# An optimizer given by name: tf-keras' .keras file stored the name, and its loader compiled
# a fresh, plain optimizer from it, which trained without DP.
@pytest.mark.parametrize("suffix", [".keras"] + ([".h5", ""] if KERAS_MAJOR == 2 else []))
@pytest.mark.parametrize("by_name", [False, True])
def test_a_loaded_private_model_refuses_to_train_until_make_private(tmp_path, suffix, by_name):
    x, y = _data()
    model = make_private(_mlp(), l2_norm_clip=0.5, noise_multiplier=1.3, sampling="shuffle",
                         delta=1e-6)
    model.compile(optimizer="adam" if by_name else keras.optimizers.Adam(0.01), loss=LOSS)
    model.fit(x, y, batch_size=4, epochs=2, verbose=0)
    spent = epsilon_spent(model)
    model.save(tmp_path / f"model{suffix}")
    loaded = keras.models.load_model(tmp_path / f"model{suffix}")
    assert not is_private(loaded)
    before = loaded.get_weights()
    with pytest.raises(NotPrivateError, match="make_private\\(model\\)"):
        loaded.fit(x, y, batch_size=4, verbose=0)  # plain Keras fit: would not be DP
    for b, a in zip(before, loaded.get_weights()):
        np.testing.assert_array_equal(a, b)
    make_private(loaded)  # the settings saved with it; a fresh secret key
    state = get_state(loaded)
    assert (state.settings.l2_norm_clip, state.settings.noise_multiplier) == (0.5, 1.3)
    assert state.sampling == "shuffle" and is_private(loaded)
    assert epsilon_spent(loaded) == pytest.approx(spent)  # the ledger travelled too
    history = loaded.fit(x, y, batch_size=4, epochs=1, verbose=0).history
    assert history["epsilon"][0] > spent[0] and history["delta"] == [1e-6]
    assert state.noise.is_secret


# tf-keras' SavedModel ("") restores the optimizer without building it on the model's
# variables: the compile marks them (before: its recompiled fit trained without DP, and
# make_private after it counted ε from 0).
def _trained_private_model_saved_and_loaded(path, x, y):
    """(the model loaded from ``path``, the ε it was saved with) of a private MLP fit once."""
    model = make_private(_mlp(), l2_norm_clip=0.5, noise_multiplier=1.3, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    model.fit(x, y, batch_size=4, verbose=0)
    model.save(path)
    return keras.models.load_model(path), epsilon_spent(model)


@pytest.mark.parametrize("suffix", [".keras"] + ([".h5", ""] if KERAS_MAJOR == 2 else []))
@pytest.mark.parametrize("then", ["fit", "make_private", "dp_gradients"])
def test_a_loaded_private_model_recompiled_refuses_until_make_private(tmp_path, suffix, then):
    # A new compile (say, another learning rate) replaced the loaded model's DP optimizer:
    # its fit trained without DP, and make_private after it restarted the ledger at ε = 0.
    x, y = _data()
    loaded, spent = _trained_private_model_saved_and_loaded(tmp_path / f"model{suffix}", x, y)
    loaded.compile(optimizer=keras.optimizers.SGD(0.01), loss=LOSS)
    before = loaded.get_weights()
    if then == "fit":
        with pytest.raises(NotPrivateError, match="make_private\\(model\\)"):
            loaded.fit(x, y, batch_size=4, verbose=0)
        for b, a in zip(before, loaded.get_weights()):
            np.testing.assert_array_equal(a, b)
    elif then == "make_private":
        make_private(loaded, l2_norm_clip=0.5, noise_multiplier=1.3)
        assert epsilon_spent(loaded) == pytest.approx(spent)  # the saved ledger, not ε = 0
        loaded.fit(x, y, batch_size=4, verbose=0)
        assert epsilon_spent(loaded)[0] > spent[0]
    else:  # a custom loop: DPGradients makes it private again, a plain optimizer applies
        from tf_tempered.privacy import DPGradients  # pylint: disable=import-outside-toplevel
        dp = DPGradients(loaded, LOSS, l2_norm_clip=0.5, noise_multiplier=1.3)
        grads, _ = dp(x[:4], y[:4])
        keras.optimizers.SGD(0.01).apply_gradients(zip(grads, loaded.trainable_variables))
        assert epsilon_spent(loaded)[0] > spent[0]


# tf-keras' SavedModel ("") loaded its DP optimizer without building it on the weights: a tape
# loop's optimizer and a plain outer model trained them without DP, and the outer model made
# private counted ε from 0 (probe K).
@pytest.mark.parametrize("suffix", [".keras"] + ([".h5", ""] if KERAS_MAJOR == 2 else []))
def test_a_loaded_private_model_s_weights_refuse_other_optimizers_until_make_private(
        tmp_path, suffix):
    x, y = _data()
    loaded, spent = _trained_private_model_saved_and_loaded(tmp_path / f"model{suffix}", x, y)
    with tf.GradientTape() as tape:
        loss = LOSS(y, loaded(x, training=True))
    grads = tape.gradient(loss, loaded.trainable_variables)
    with pytest.raises(NotPrivateError, match="make_private\\(model\\)"):
        keras.optimizers.SGD(0.1).apply_gradients(zip(grads, loaded.trainable_variables))
    outer = keras.Sequential([loaded, keras.layers.Dense(2)])
    outer.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    with pytest.raises(NotPrivateError):
        outer.fit(x, y, batch_size=4, verbose=0)
    make_private(outer)
    assert epsilon_spent(outer) == pytest.approx(spent)  # the saved ledger, not ε = 0


def test_a_second_make_private_keeps_what_the_first_was_given():
    x, y = _data()
    model = make_private(_mlp(), l2_norm_clip=0.5, noise_multiplier=1.3, sampling="shuffle")
    model.compile(optimizer="sgd", loss=LOSS)
    first = model.fit(x, y, batch_size=4, verbose=0).history["epsilon"]
    key = get_state(model).noise
    make_private(model)
    state = get_state(model)
    assert (state.settings.noise_multiplier, state.sampling) == (1.3, "shuffle")
    assert state.noise is not key  # re-keyed
    second = model.fit(x, y, batch_size=4, verbose=0).history["epsilon"]
    assert second[0] > first[0]  # the first fit still counts


def test_is_private_only_when_the_next_fit_is_dp():
    model = make_private(_mlp())
    assert not is_private(model)  # no settings yet
    model.compile(optimizer="sgd", loss=LOSS)
    assert not is_private(model)  # a plain optimizer: fit would refuse
    from tf_tempered.privacy import DPKerasSGDOptimizer  # pylint: disable=import-outside-toplevel
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0),
                  loss=LOSS)
    assert is_private(model)


def _transfer_model(dtype):
    base = keras.Sequential([keras.Input((5,), dtype=dtype),
                             keras.layers.Dense(6, activation="tanh", dtype=dtype),
                             keras.layers.Dense(6, activation="tanh", dtype=dtype)],
                            name="base")
    inputs = keras.Input((5,), dtype=dtype)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(base(inputs)))


def test_unfreezing_after_make_private_trains_every_trainable_layer_exactly():
    # Keras' transfer-learning flow: freeze the base, train the head, unfreeze the top
    # of the base, recompile, fine-tune.
    x, y = _data()
    model = _transfer_model("float32")
    base = model.get_layer("base")
    base.trainable = False
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    model.fit(x, y, batch_size=4, verbose=0)
    base.trainable = True
    base.layers[0].trainable = False
    weights = model.get_weights()

    def build(dtype):
        fresh = _transfer_model(dtype)
        fresh.get_layer("base").layers[0].trainable = False
        return fresh

    norms, reference = per_example_reference(build, weights, x, y, _sce)
    clip = median_clip(norms)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS)
    before = [w.numpy() for w in model.trainable_variables]
    model.fit(x, y, batch_size=ROWS, shuffle=False, verbose=0)
    ours = [w.numpy() - b for w, b in zip(model.trainable_variables, before)]
    assert len(ours) == 4  # the unfrozen base layer's kernel and bias, and the head's
    assert_update(ours, reference(clip))


def _cnn(dtype):
    return keras.Sequential([
        keras.Input((7, 7, 2), dtype=dtype),
        keras.layers.Conv2D(4, 3, activation="tanh", dtype=dtype),
        keras.layers.Conv2D(3, 2, strides=2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype)])


def _depthwise_cnn(dtype):
    return keras.Sequential([
        keras.Input((7, 7, 2), dtype=dtype),
        keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="tanh", dtype=dtype),
        keras.layers.SeparableConv2D(3, 2, strides=2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype)])


def _strided_cnn(dtype):  # a first layer like the MNIST CNN's conv1: gradients kept
    return keras.Sequential([
        keras.Input((12, 12, 1), dtype=dtype),
        keras.layers.Conv2D(4, 6, strides=2, padding="same", activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype)])


# Under XLA: no native op, and no depthwise backprop (XLA on CPU runs the folded depthwise
# backprop tens of times slower than image patches), for Conv2D and the depthwise layers;
# a Conv2D whose gradients are kept takes the products per kernel offset instead of patches.
_XLA_PATHS = {
    "conv2d": (_cnn, ("Conv2D",), ("native=False", "depthwise=False")),
    "conv2d_offsets": (_strided_cnn, ("Conv2D",), ("native=False", "depthwise=False",
                                                   "materialize=True", "kept_by='offsets'")),
    "depthwise": (_depthwise_cnn, ("DepthwiseConv2D", "SeparableConv2D"), ("method='patches'",)),
}


@pytest.mark.parametrize("kind", list(_XLA_PATHS))
def test_jit_compile_takes_the_xla_paths_and_is_exact(kind):
    builder, classes, path_marks = _XLA_PATHS[kind]
    x, y = _data(builder("float32").input_shape[1:])
    weights = builder("float32").get_weights()
    norms, reference = per_example_reference(builder, weights, x, y, _sce)
    clip = median_clip(norms)
    model = builder("float32")
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip, loss=LOSS, jit_compile=True)
    assert_update(ours, reference(clip))
    paths = [p["path"] for p in layer_paths(model) if p["class"] in classes]
    assert len(paths) == len(classes) + (kind == "conv2d")  # the CNN has two Conv2D
    assert all(mark in p for p in paths for mark in path_marks), paths


def test_jit_compile_offsets_path_sums_per_microbatch():
    """The products per kernel offset (XLA) summed per microbatch of several examples: the
    update equals the float64 per-microbatch reference."""
    from dp_reference import assert_engine_matches_reference  # pylint: disable=g-import-not-at-top
    x, y = _data((12, 12, 1))
    assert_engine_matches_reference(_strided_cnn, x, y, num_microbatches=ROWS // 2,
                                    static_batch=True, jit_compile=True)


def test_jit_compile_blocks_path_sums_per_microbatch():
    """EngineOptions(conv_blocks=True) under XLA: the products per block of kernel offsets,
    summed per microbatch of several examples, give the float64 reference's update."""
    from dp_reference import assert_engine_matches_reference  # pylint: disable=g-import-not-at-top
    x, y = _data((12, 12, 1))
    options = EngineOptions(native=False, depthwise_max_channel_pairs=0, conv_blocks=True)
    assert_engine_matches_reference(_strided_cnn, x, y, num_microbatches=ROWS // 2,
                                    static_batch=True, jit_compile=True, options=options)


def _mixed_precision_update(policy, builder, *, jit_compile, options=None):
    """(the engine's update under ``policy``, the float64 reference's, the model, history)."""
    x, y = _data(builder("float32").input_shape[1:])
    weights = builder("float32").get_weights()
    norms, reference = per_example_reference(builder, weights, x, y, _sce)
    clip = median_clip(norms)
    keras.mixed_precision.set_global_policy(policy)
    try:
        # The policy's layers, the logits in float32 (as Keras' guide writes them).
        model = keras.Sequential([keras.Input(builder("float32").input_shape[1:])] + [
            type(layer).from_config({**layer.get_config(), "dtype": policy})
            for layer in builder("float32").layers[:-1]] + [
            keras.layers.Dense(3, dtype="float32")])
        model.set_weights(weights)
        assert model.layers[0].compute_dtype == policy.split("_")[1]
        ours, history = engine_update(model, x, y, clip=clip, loss=LOSS, options=options,
                                      jit_compile=jit_compile)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    return ours, reference(clip), model, history


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_mixed_precision_gives_the_float32_update(policy, jit_compile):
    # Norms and clipping in float32, no loss scale applied to the DP update. The
    # reference is float64; the forward pass in half precision bounds the agreement.
    ours, reference, _, history = _mixed_precision_update(policy, _cnn, jit_compile=jit_compile)
    assert history["dp_nonfinite"] == [0.0]
    assert_update(ours, reference, rtol=2e-2 if policy == "mixed_bfloat16" else 5e-3)


# Before: tf-keras failed inside its optimizer ("Input 'y' of 'Mul' Op has type float16 that
# does not match type float32") for a float16 or bfloat16 weight: the DP update was float32.
@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_a_half_precision_layer_gets_its_update_in_its_dtype(half):
    x, y = _data()
    weights = _mlp("float32").get_weights()
    norms, reference = per_example_reference(_mlp, weights, x, y, _sce)
    clip = median_clip(norms)
    model = keras.Sequential([keras.Input((5,)),
                              keras.layers.Dense(6, activation="tanh", dtype=half),
                              keras.layers.Dense(3)])
    model.set_weights(weights)
    ours, history = engine_update(model, x, y, clip=clip, loss=LOSS)
    assert model.layers[0].kernel.dtype == half and history["dp_nonfinite"] == [0.0]
    assert_update(ours, reference(clip), rtol=3e-2 if half == "bfloat16" else 5e-3)


# How kept Conv2D gradients are formed from half-precision inputs against the float32 output
# gradient: products per kernel offset (XLA's default), per block of offsets (forced here:
# the TF executor's default where TF's kernels are Eigen's, whatever this host runs).
_KEPT_BY = {
    "offsets": dict(jit_compile=True),
    "blocks": dict(jit_compile=False, options=EngineOptions(
        native=False, depthwise_max_channel_pairs=0, conv_blocks=True)),
}


@pytest.mark.parametrize("kept_by", list(_KEPT_BY))
def test_mixed_precision_kept_conv_gradients_give_the_float32_update(kept_by):
    """mixed_float16: a strided Conv2D's kept gradients, by offsets or by blocks, give the
    float32 update."""
    ours, reference, model, history = _mixed_precision_update("mixed_float16", _strided_cnn,
                                                              **_KEPT_BY[kept_by])
    assert history["dp_nonfinite"] == [0.0]
    assert_update(ours, reference, rtol=5e-3)
    conv = [p["path"] for p in layer_paths(model) if p["class"] == "Conv2D"]
    assert len(conv) == 1 and f"kept_by='{kept_by}'" in conv[0], conv


class _Subclassed(keras.Model):
    """_cnn's layers in a subclassed model (no Input declared)."""

    def __init__(self):
        super().__init__(name="subclassed_cnn")  # Keras 3: not "__subclassed"
        self.inner = [layer for layer in _cnn("float32").layers]

    def call(self, x):
        for layer in self.inner:
            x = layer(x)
        return x


def _generator(x, y):
    while True:
        yield x, y


class _OneBatch(getattr(keras.utils, "PyDataset", keras.utils.Sequence)):
    def __init__(self, x, y):
        super().__init__()
        self.x, self.y = x, y

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return self.x, self.y


@pytest.mark.filterwarnings("ignore:fit on a pipeline tf_tempered did not build")
@pytest.mark.parametrize("kind", ["functional", "subclassed"])
@pytest.mark.parametrize("source", ["generator", "sequence"])
def test_fit_on_a_generator_or_a_sequence_gives_the_reference_update(kind, source):
    """tf-keras batches a Python generator or a Sequence with every dimension unknown; the
    step takes the model's declared input shape (its Input, or the shape a subclassed model
    was first called with), and the update is the float64 reference's."""
    x, y = _data((7, 7, 2))
    weights = _cnn("float32").get_weights()
    norms, reference = per_example_reference(_cnn, weights, x, y, _sce)
    clip = median_clip(norms)
    model = _cnn("float32") if kind == "functional" else _Subclassed()
    model(x[:2])
    model.set_weights(weights)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS)
    before = [w.numpy() for w in model.trainable_variables]
    data = _generator(x, y) if source == "generator" else _OneBatch(x, y)
    model.fit(data, steps_per_epoch=1, epochs=1, verbose=0)
    ours = [w.numpy() - b for w, b in zip(model.trainable_variables, before)]
    assert_update(ours, reference(clip))


def _two_inputs():
    first, second = keras.Input((5,), name="first"), keras.Input((4,), name="second")
    joined = keras.layers.Concatenate()([keras.layers.Dense(3, activation="tanh")(first),
                                         keras.layers.Dense(3, activation="tanh")(second)])
    return keras.Model([first, second], keras.layers.Dense(3)(joined))


@pytest.mark.filterwarnings("ignore:fit on a pipeline tf_tempered did not build")
@pytest.mark.parametrize("structure", ["tuple", "dict"])
def test_a_generator_of_several_inputs_gives_the_update_of_the_arrays(structure):
    """Two Inputs from a generator (tf-keras: every dimension unknown), as a tuple or a dict
    by Input name: the same update as fit on the arrays."""
    x, y = _data((9,))
    inputs = [x[:, :5], x[:, 5:]]
    weights = _two_inputs().get_weights()
    expected_model = _two_inputs()
    expected_model.set_weights(weights)
    expected, _ = engine_update(expected_model, inputs, y, clip=0.5, loss=LOSS)
    model = _two_inputs()
    model.set_weights(weights)
    make_private(model, l2_norm_clip=0.5, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS)
    before = [w.numpy() for w in model.trainable_variables]
    batch = tuple(inputs) if structure == "tuple" else dict(zip(["first", "second"], inputs))
    model.fit(_generator(batch, y), steps_per_epoch=1, epochs=1, verbose=0)
    assert_update([w.numpy() - b for w, b in zip(model.trainable_variables, before)], expected)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3 optimizers' gradient_accumulation_steps")
def test_gradient_accumulation_applies_the_mean_of_the_dp_gradients_and_counts_each_step():
    """SGD(gradient_accumulation_steps=2): the update is the mean of two steps' DP
    gradients at the same weights, and ε counts both releases (2 Poisson steps)."""
    x, y = _data()
    weights = _mlp().get_weights()

    def private(noise, **optimizer_kwargs):
        model = _mlp()
        model.set_weights(weights)
        make_private(model, l2_norm_clip=0.3, noise_multiplier=noise,
                     sampling="shuffle" if noise == 0 else "poisson")
        model.compile(optimizer=keras.optimizers.SGD(1.0, **optimizer_kwargs), loss=LOSS)
        return model

    half = ROWS // 2
    single = []
    for rows in (slice(0, half), slice(half, ROWS)):
        model = private(0.0)
        model.fit(x[rows], y[rows], batch_size=half, shuffle=False, verbose=0)
        single.append([w - v for w, v in zip(weights, model.get_weights())])
    model = private(0.0, gradient_accumulation_steps=2)
    model.fit(x, y, batch_size=half, shuffle=False, verbose=0)
    accumulated = [w - v for w, v in zip(weights, model.get_weights())]
    assert_update(accumulated, [(a + b) / 2 for a, b in zip(*single)])
    model = private(1.0, gradient_accumulation_steps=2)
    model.fit(x, y, batch_size=half, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 1  # one applied update, two releases
    import dp_accounting  # pylint: disable=g-import-not-at-top
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.5, dp_accounting.GaussianDpEvent(1.0)), 2))
    assert epsilon_spent(model)[0] == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-9)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3 optimizers' loss_scale_factor")
def test_an_optimizer_loss_scale_factor_leaves_the_dp_update_unscaled():
    """SGD(loss_scale_factor=128): Keras divides by it the gradients of the loss it
    scaled; the DP update was divided too (128 times too small)."""
    x, y = _data()
    weights = _mlp().get_weights()
    norms, reference = per_example_reference(_mlp, weights, x, y, _sce)
    clip = median_clip(norms)
    model = _mlp()
    model.set_weights(weights)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0, loss_scale_factor=128.0), loss=LOSS)
    model.fit(x, y, batch_size=ROWS, shuffle=False, verbose=0)
    assert_update([a - b for a, b in zip(model.get_weights(), weights)], reference(clip))


def test_a_fully_frozen_model_fits_without_an_update_then_trains_once_unfrozen():
    """Every layer frozen (Keras 3's optimizer cannot apply an empty update): fit runs,
    changes nothing, and its steps count; unfrozen and recompiled, it trains."""
    x, y = _data()
    model = make_private(_mlp(), l2_norm_clip=1.0, noise_multiplier=1.1)
    model.trainable = False
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    assert epsilon_spent(model)[0] > 0  # the steps were taken (a bound that still holds)
    model.trainable = True
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=LOSS)
    model.fit(x, y, batch_size=4, verbose=0)
    assert all((a != b).any() for a, b in zip(before, model.get_weights()))


def _trained_private_mlp():
    x, y = _data()
    model = make_private(_mlp(), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    model.fit(x, y, batch_size=4, verbose=0)
    return model


def _assert_loaded_refuses_then_counts(path, spent):
    """The model loaded from ``path`` refuses a plain fit; made private, its ε is ``spent``."""
    loaded = keras.models.load_model(path)
    if not loaded.compiled if KERAS_MAJOR == 3 else loaded.optimizer is None:  # saved without
        loaded.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    x, y = _data()
    with pytest.raises(NotPrivateError):
        loaded.fit(x, y, batch_size=4, verbose=0)
    assert epsilon_spent(make_private(loaded))[0] == pytest.approx(spent)


# Before: silent; the file held no ledger, and a model loaded from it counted ε from 0. Then
# (stop 68) warned; now (stop 76) the file keeps the DP dict (privacy/model_files.py).
@pytest.mark.parametrize("how", ["method", "function"])
def test_a_private_model_saved_without_its_optimizer_keeps_its_dp(tmp_path, how):
    model = _trained_private_mlp()
    path = str(tmp_path / "m.h5")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r"(?s).*\bDP\b", UserWarning)  # (not Keras' own)
        if how == "method":
            model.save(path, include_optimizer=False)
        else:
            keras.models.save_model(model, path, include_optimizer=False)
    _assert_loaded_refuses_then_counts(path, epsilon_spent(model)[0])


# Before (Keras 2): silent, and the loaded outer model trained the private weights without
# DP (make_private on it counted ε from 0). Then warned; now the file keeps the DP dict.
@pytest.mark.parametrize("suffix", [".h5", ".keras"] + (["", ] if KERAS_MAJOR == 2 else []))
def test_saving_a_plain_model_holding_a_private_model_keeps_its_dp(tmp_path, suffix):
    inner = _trained_private_mlp()
    outer = keras.Sequential([keras.Input((5,)), inner])
    outer.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    path = str(tmp_path / f"outer{suffix}")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", r"(?s).*\bDP\b", UserWarning)  # (not Keras' own)
        outer.save(path)
    _assert_loaded_refuses_then_counts(path, epsilon_spent(inner)[0])


def test_saving_a_plain_model_holding_a_private_model_made_private_keeps_its_epsilon(
        tmp_path):
    inner = _trained_private_mlp()
    spent = epsilon_spent(inner)[0]
    outer = make_private(keras.Sequential([keras.Input((5,)), inner]), l2_norm_clip=1.0,
                         noise_multiplier=1.0)
    outer.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no warning: the file keeps the ledger
        outer.save(str(tmp_path / "outer.keras"))
    loaded = keras.models.load_model(str(tmp_path / "outer.keras"))
    x, y = _data()
    with pytest.raises(NotPrivateError):
        loaded.fit(x, y, batch_size=4, verbose=0)
    assert epsilon_spent(make_private(loaded))[0] == pytest.approx(spent)


# Before (Keras 2): refused with tf-keras' "Weights for model 'sequential' have not yet been
# created" (the step read an unbuilt nested Sequential's weights before the forward pass).
def test_a_model_holding_an_unbuilt_nested_sequential_trains():
    x, y = _data()
    model = make_private(keras.Sequential([keras.Sequential([keras.layers.Dense(4)]),
                                           keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    history = model.fit(x, y, batch_size=4, epochs=2, verbose=0).history
    before = [w.copy() for w in model.get_weights()]
    model.fit(x, y, batch_size=4, verbose=0)
    assert all((a != b).any() for a, b in zip(before, model.get_weights()))
    assert 0 < history["epsilon"][0] < history["epsilon"][1]
