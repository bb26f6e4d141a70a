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
"""The LoRA handler (layer_grads/lora.py) against float64 per-microbatch references.

Keras 3 only (tf-keras has no `enable_lora`). Each case builds a small model whose
Dense / EinsumDense layers have LoRA enabled, with B made non-zero (enable_lora starts
it at zero, which would make A's gradient zero), and checks one DP step (noise 0) of
the engine against tests/dp_reference.py, and that the layers took the LoRA handler.
"""

import numpy as np
import pytest

from dp_reference import BATCH, _seeded, assert_engine_matches_reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf

pytestmark = pytest.mark.skipif(KERAS_MAJOR != 3, reason="LoRA (enable_lora) is Keras 3 only")

if KERAS_MAJOR == 3:
    from tf_tempered.privacy import EngineOptions, layer_grads, layer_paths, make_private
    from tf_tempered.privacy import DPKerasSGDOptimizer
    from tf_tempered.privacy.layer_grads import lora


def _nonzero_factors(model, seed=1):
    """B (and any other all-zero LoRA factor) drawn at random: every gradient non-zero."""
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if getattr(layer, "lora_enabled", False):
            for variable in (layer.lora_kernel_a, layer.lora_kernel_b):
                if not np.any(variable.numpy()):
                    variable.assign(0.3 * rng.normal(size=variable.shape))
    return model


def _dense_2d(dtype, freeze=()):
    """[B, d] → Dense(LoRA) → Dense(LoRA, alpha 3): `freeze` names variables to freeze."""
    inputs = keras.Input((6,), dtype=dtype)
    first = keras.layers.Dense(5, activation="tanh", dtype=dtype)
    second = keras.layers.Dense(3, dtype=dtype)
    model = keras.Model(inputs, second(first(inputs)))
    first.enable_lora(2)
    second.enable_lora(2, lora_alpha=3)
    _nonzero_factors(model)
    for name in freeze:  # "bias", "lora_kernel_a", "lora_kernel_b"; "layer": the first layer
        if name == "layer":
            first.trainable = False
        else:
            getattr(first, name).trainable = False
    return model


def _dense_sequence(dtype):
    """[B, T, d] → Dense(LoRA, no bias) → Dense(LoRA) on every position → mean → Dense."""
    inputs = keras.Input((7, 4), dtype=dtype)
    x = keras.layers.Dense(6, activation="tanh", use_bias=False, dtype=dtype)(inputs)
    x = keras.layers.Dense(5, activation="tanh", dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    model = keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(x))
    for layer in model.layers[1:3]:
        layer.enable_lora(3)
    return _nonzero_factors(model)


def _einsum_attention_style(dtype):
    """[B, T, d] → EinsumDense "abc,cde->abde" (a query projection, LoRA) → "abcd,cde->abe"
    (an attention output projection, LoRA, bias "e") → mean → Dense."""
    inputs = keras.Input((5, 6), dtype=dtype)
    x = keras.layers.EinsumDense("abc,cde->abde", (None, 2, 3), bias_axes="de",
                                 activation="tanh", dtype=dtype)(inputs)
    x = keras.layers.EinsumDense("abcd,cde->abe", (None, 4), bias_axes="e",
                                 dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    model = keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(x))
    model.layers[1].enable_lora(2)
    model.layers[2].enable_lora(2, lora_alpha=4)
    return _nonzero_factors(model)


def _data(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH,) + shape), rng.integers(0, 3, BATCH)


def _handlers(builder):
    """{layer name: handler name} of a fresh model's Dense/EinsumDense layers."""
    model = builder("float32")
    return [layer_grads.lookup(layer)[0].name for layer in model.layers
            if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))]


_CASES = {
    "dense_2d": (_dense_2d, (6,), ["lora_dense", "lora_dense"]),
    "dense_sequence": (_dense_sequence, (7, 4), ["lora_dense", "lora_dense", "dense"]),
    "einsum_attention": (_einsum_attention_style, (5, 6),
                         ["lora_einsum_dense", "lora_einsum_dense", "dense"]),
}


@pytest.mark.parametrize("num_microbatches,static_batch", [(None, True), (4, False)])
@pytest.mark.parametrize("case", sorted(_CASES))
def test_lora_step_matches_reference(case, num_microbatches, static_batch):
    builder, shape, handlers = _CASES[case]
    builder = _seeded(builder)
    assert _handlers(builder) == handlers
    x, y = _data(shape)
    assert_engine_matches_reference(builder, x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    cache_key=(case, num_microbatches))


@pytest.mark.parametrize("norm_path", ["ghost", "materialize"])
def test_lora_forced_paths_match_reference(norm_path):
    builder = _seeded(_einsum_attention_style)
    x, y = _data((5, 6))
    assert_engine_matches_reference(builder, x, y, num_microbatches=4, static_batch=True,
                                    options=EngineOptions(norm_path=norm_path),
                                    cache_key=("einsum_attention", 4))


def test_lora_path_decided_per_step_matches_reference():
    """One example per microbatch and a batch size unknown while tracing: ghost norm or
    materialization is chosen per step (a tf.cond)."""
    builder = _seeded(_einsum_attention_style)
    x, y = _data((5, 6))
    assert_engine_matches_reference(builder, x, y, num_microbatches=None, static_batch=False,
                                    cache_key=("einsum_attention", None))


@pytest.mark.parametrize("freeze,trains", [
    (("bias",), ("a", "b")),
    (("lora_kernel_a",), ("b", "bias")),
    (("lora_kernel_b", "bias"), ("a",)),
    (("layer",), None),
])
def test_partially_trainable_lora_layers(freeze, trains):
    builder = _seeded(lambda dtype: _dense_2d(dtype, freeze))
    model = builder("float32")
    first, second = model.layers[1:3]
    handler, params = layer_grads.lookup(second)
    assert handler.name == "lora_dense" and params.trains == ("a", "b", "bias")
    if trains is None:  # a frozen layer is not recorded at all
        assert not first.trainable_weights
    else:
        handler, params = layer_grads.lookup(first)
        assert handler.name == "lora_dense" and params.trains == trains
    x, y = _data((6,))
    assert_engine_matches_reference(builder, x, y, num_microbatches=4, static_batch=True)


def test_trainable_base_kernel_is_covered_too():
    def builder(dtype):
        model = _dense_2d(dtype)
        model.layers[1]._kernel.trainable = True  # pylint: disable=protected-access
        return model

    builder = _seeded(builder)
    params = layer_grads.lookup(builder("float32").layers[1])[1]
    assert params.trains == ("kernel", "a", "b", "bias")
    x, y = _data((6,))
    assert_engine_matches_reference(builder, x, y, static_batch=True)


def test_jit_compiled_lora_step_matches_reference():
    builder = _seeded(_dense_sequence)
    x, y = _data((7, 4))
    model = builder("float32")
    weights = model.get_weights()
    make_private(model)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1e9, noise_multiplier=0.0,
                                                learning_rate=1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    model.fit(x.astype("float32"), y, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    reference = builder("float32")
    reference.set_weights(weights)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y, reference(x.astype("float32")), from_logits=True))
    grads = tape.gradient(loss, reference.trainable_variables)
    for before, after, grad in zip(reference.trainable_variables, model.trainable_variables,
                                   grads):
        np.testing.assert_allclose(after.numpy(), before.numpy() - grad.numpy(), atol=2e-5)
    assert [p["handler"] for p in layer_paths(model)][:2] == ["lora_dense", "lora_dense"]


def test_layer_paths_name_the_lora_handler():
    model = _seeded(_einsum_attention_style)("float32")
    make_private(model)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = _data((5, 6))
    model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)
    paths = layer_paths(model)
    assert [p["handler"] for p in paths] == ["lora_einsum_dense", "lora_einsum_dense", "dense"]
    assert all(p["path"].startswith("LoraPath(a=RowsPath(") for p in paths[:2])


def test_factor_grads_against_the_merged_kernel():
    """The factors' per-example gradients are s·∂W·Bᵀ and s·Aᵀ·∂W of the merged kernel's."""
    rng = np.random.default_rng(0)
    x, g = rng.normal(size=(3, 4, 5)), rng.normal(size=(3, 4, 2, 6))
    a, b = rng.normal(size=(5, 2, 3)), rng.normal(size=(3, 6))
    grads = lora.factor_grads("abc,cde->abde", x, g, a, b, 0.5)
    w = np.einsum("abc,abde->acde", x, g)  # per-example gradients of the merged kernel
    np.testing.assert_allclose(grads["kernel"], w)
    np.testing.assert_allclose(grads["a"], 0.5 * np.einsum("xcde,re->xcdr", w, b))
    np.testing.assert_allclose(grads["b"], 0.5 * np.einsum("cdr,xcde->xre", a, w))


def test_declined_variants_take_the_generic_vjp():
    contracted_last = keras.layers.EinsumDense("abc,dc->abd", (None, 4))
    contracted_last.build((None, 3, 6))
    contracted_last.enable_lora(2)
    quantized = keras.layers.Dense(4)
    quantized.build((None, 6))
    quantized.quantize("int8")
    quantized.enable_lora(2)
    for layer in (contracted_last, quantized):
        assert layer_grads.lookup(layer)[0] is layer_grads.GENERIC, layer.name
