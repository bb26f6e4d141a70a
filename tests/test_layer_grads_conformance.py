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
"""Every layer_grads handler (and the generic fallback) against a per-microbatch reference.

One engine step (noise 0) of a small model holding the layer equals DP-SGD
written out with one float64 GradientTape per microbatch (dp_reference.py;
clip norm = median of the reference norms), for M = batch, a divisor and 1,
static and unknown batch size, and every path the handler can take.

Adding a layer type = a handler in tf_tempered/privacy/layer_grads/ + one entry
in CASES below.
"""

import logging

import numpy as np
import pytest

from dp_reference import BATCH, assert_engine_matches_reference, seeded
from tf_tempered._compat import keras
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.privacy import (DPKerasSGDOptimizer, EngineOptions, keras_bridge, layer_grads,
                                 make_private, native)

_TF_OPS = {"native": False}
# Paths of a Dense-like row handler (Dense, EinsumDense).
_ROW_PATHS = {"auto": {}, "ghost": {"norm_path": "ghost"},
              "materialize": {"norm_path": "materialize"},
              "no-memory": {"materialize_max_bytes": 0}}
_CONV_PATHS = {
    "tf-auto": _TF_OPS,
    "tf-ghost": {**_TF_OPS, "norm_path": "ghost"},
    "tf-materialize": {**_TF_OPS, "norm_path": "materialize"},
    "tf-depthwise": {**_TF_OPS, "norm_path": "depthwise"},
    "tf-chunks": {**_TF_OPS, "patch_chunk_bytes": 1, "depthwise_max_channel_pairs": 0},
    "native-auto": {},
    "native-materialized": {"norm_path": "native", "native_materialize_min_rows": 0},
    "native-norms-only": {"norm_path": "native", "materialize_max_bytes": 0},
}


def _dense(dtype):
    # [B, T, d] input: several rows per example.
    return keras.Sequential([
        keras.Input((4, 6), dtype=dtype),
        keras.layers.Dense(5, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _conv2d(dtype):
    return keras.Sequential([
        keras.Input((8, 7, 2), dtype=dtype),
        keras.layers.Conv2D(3, 3, padding="same", activation="tanh", dtype=dtype),
        keras.layers.Conv2D(4, 3, strides=2, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


_VOCAB = 5000  # large enough that a dense per-example gradient would matter


def _embedding(dtype):
    # Ids arrive as floats (the reference helper casts inputs); Keras casts them back.
    return keras.Sequential([
        keras.Input((6,), dtype=dtype),
        keras.layers.Embedding(_VOCAB, 4, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _einsum_dense(dtype):
    # MultiHeadAttention's equations: a q/k/v projection and the output projection.
    return keras.Sequential([
        keras.Input((4, 6), dtype=dtype),
        keras.layers.EinsumDense("abc,cde->abde", (4, 2, 3), bias_axes="de",
                                 activation="tanh", dtype=dtype),
        keras.layers.EinsumDense("abcd,cde->abe", (4, 5), bias_axes="e", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _einsum_dense_row_bias(dtype):
    # A bias over a row axis: not the ones-column trick, per-example bias sums.
    return keras.Sequential([
        keras.Input((4, 6), dtype=dtype),
        keras.layers.EinsumDense("abc,cd->abd", (4, 5), bias_axes="b", activation="tanh",
                                 dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _transformer_block(dtype):
    tokens = keras.Input((5,), dtype=dtype)
    x = keras.layers.Embedding(50, 6, dtype=dtype)(tokens)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=3, dtype=dtype)(x, x)
    x = keras.layers.LayerNormalization(dtype=dtype)(keras.layers.Add(dtype=dtype)([x, attended]))
    x = keras.layers.Dense(6, activation="tanh", dtype=dtype)(x)
    x = keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)
    return keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(x))


class _DenseWithOwnCall(keras.layers.Dense):
    """A Dense subclass overriding `call`: its handler must be the generic one."""

    def call(self, inputs):
        return super().call(inputs) * 0.5


def _generic(dtype):
    return keras.Sequential([
        keras.Input((6,), dtype=dtype),
        _DenseWithOwnCall(5, activation="tanh", dtype=dtype),
        keras.layers.LayerNormalization(dtype=dtype),
        TemperedSigmoid(learnable=True, dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _floats(shape, seed):
    return np.random.default_rng(seed).normal(size=(BATCH,) + shape)


def _ids(shape, seed, vocab):
    # Mostly a few small ids (duplicates within and across examples), some large ones.
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 4, size=(BATCH,) + shape)
    rare = rng.random(ids.shape) < 0.3
    return np.where(rare, rng.integers(vocab - 3, vocab, size=ids.shape), ids)


# name: (builder, inputs(seed), paths, {layer class name: handler name})
CASES = {
    "dense": (_dense, lambda s: _floats((4, 6), s), _ROW_PATHS, {"Dense": "dense"}),
    "conv2d": (_conv2d, lambda s: _floats((8, 7, 2), s), _CONV_PATHS,
               {"Conv2D": "conv2d", "Dense": "dense"}),
    "embedding": (_embedding, lambda s: _ids((6,), s, _VOCAB), {"auto": {}},
                  {"Embedding": "embedding", "Dense": "dense"}),
    "einsum_dense": (_einsum_dense, lambda s: _floats((4, 6), s), _ROW_PATHS,
                     {"EinsumDense": "einsum_dense", "Dense": "dense"}),
    "einsum_dense_row_bias": (_einsum_dense_row_bias, lambda s: _floats((4, 6), s), _ROW_PATHS,
                              {"EinsumDense": "einsum_dense", "Dense": "dense"}),
    "transformer_block": (_transformer_block, lambda s: _ids((5,), s, 50),
                          {"auto": {}, "ghost": {"norm_path": "ghost"}},
                          {"EinsumDense": "einsum_dense", "Embedding": "embedding",
                           "LayerNormalization": "generic", "Dense": "dense"}),
    "generic": (_generic, lambda s: _floats((6,), s), {"auto": {}},
                {"_DenseWithOwnCall": "generic", "LayerNormalization": "generic",
                 "TemperedSigmoid": "generic", "Dense": "dense"}),
}

_PARAMS = [pytest.param(case, path, id=f"{case}-{path}")
           for case, (_, _, paths, _) in CASES.items() for path in paths]


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4, 1], ids=["M=batch", "M=4", "M=1"])
@pytest.mark.parametrize("case,path", _PARAMS)
def test_handler_update_equals_per_microbatch_reference(case, path, num_microbatches,
                                                        static_batch):
    builder, inputs, paths, _ = CASES[case]
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    x = inputs(num_microbatches or 0)
    y = np.random.default_rng(1).integers(0, 3, BATCH)
    assert_engine_matches_reference(seeded(builder), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    options=EngineOptions(**paths[path]))


def _trainable_layers(model):
    """The layers that own trainable weights (MultiHeadAttention's are its EinsumDense)."""
    return [layer for layer in keras_bridge.flatten_layers(model)
            if keras_bridge.own_trainable_weights(layer)]


@pytest.mark.parametrize("case", list(CASES))
def test_each_layer_takes_its_handler(case):
    builder, _, _, expected = CASES[case]
    model = builder("float32")
    names = {}
    for layer in _trainable_layers(model):
        names.setdefault(type(layer).__name__, set()).add(layer_grads.lookup(layer)[0].name)
    assert names == {k: {v} for k, v in expected.items()}


def test_subclass_inheriting_call_keeps_the_handler():
    class Renamed(keras.layers.Dense):
        pass

    layer = Renamed(3)
    layer.build((None, 4))
    assert layer_grads.lookup(layer)[0].name == "dense"
    assert layer_grads.lookup(_DenseWithOwnCall(3))[0] is layer_grads.GENERIC


def test_generic_layers_are_logged_once_per_model(caplog):
    model = make_private(seeded(_generic)("float32"))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    x, y = _floats((6,), 0), np.zeros(BATCH)
    with caplog.at_level(logging.INFO, logger="tf_tempered.privacy.engine"):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
        model.fit(x[:8], y[:8], batch_size=8, verbose=0)  # retraced: not logged again
    lines = [r.getMessage() for r in caplog.records if "generic per-layer VJP" in r.getMessage()]
    assert len(lines) == 1
    assert "layer_normalization" in lines[0] and "DenseWithOwnCall" in lines[0]
