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
"""Whole models that mix the handlers' layers, as users build them, against float64 references.

The conformance test holds each handler to per-microbatch tapes on small models
of its own; here the layers meet: dilated, grouped, depthwise and separable
convolutions with normalization; an Embedding with a large vocabulary feeding a
causal dilated Conv1D, a Bidirectional LSTM, self-attention, a learnable tempered
sigmoid and a Dense layer shared by two branches; a dilated Conv3D into a strided
Conv2DTranspose. One DP step (noise 0, clip norm at the median microbatch norm:
some clipped, some not) must equal DP-SGD written out with one float64 tape per
microbatch (dp_reference.py), and every trainable layer must take its handler, not
the generic fallback.
"""

import numpy as np
import pytest

from dp_reference import (BATCH, assert_engine_matches_reference, seeded,
                          skip_without_onednn_conv_gradients)
from tf_tempered._compat import keras
from tf_tempered.layers import TemperedSigmoid
from tf_tempered import keras_bridge
from tf_tempered.privacy import layer_grads

_VOCAB = 20000


def _vision(dtype):
    return keras.Sequential([
        keras.Input((10, 10, 3), dtype=dtype),
        keras.layers.Conv2D(6, 3, dilation_rate=2, padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.DepthwiseConv2D(3, strides=2, depth_multiplier=2, activation="tanh",
                                     dtype=dtype),
        keras.layers.SeparableConv2D(5, 3, padding="same", dtype=dtype),
        keras.layers.LayerNormalization(dtype=dtype),
        TemperedSigmoid(dtype=dtype),
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _vision_grouped(dtype):
    return keras.Sequential([
        keras.Input((9, 9, 4), dtype=dtype),
        keras.layers.Conv2D(8, 3, groups=2, dilation_rate=2, activation="tanh", dtype=dtype),
        keras.layers.GroupNormalization(groups=4, dtype=dtype),
        keras.layers.Conv2D(6, 3, strides=2, groups=2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _text(dtype):
    tokens = keras.Input((8,), dtype=dtype)
    x = keras.layers.Embedding(_VOCAB, 6, dtype=dtype)(tokens)
    x = keras.layers.Conv1D(6, 3, padding="causal", dilation_rate=2, activation="tanh",
                            dtype=dtype)(x)
    x = keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True, dtype=dtype),
                                   dtype=dtype)(x)
    attended = keras.layers.MultiHeadAttention(2, 3, dtype=dtype)(x, x)
    x = keras.layers.LayerNormalization(dtype=dtype)(keras.layers.Add(dtype=dtype)([x, attended]))
    x = TemperedSigmoid(learnable=True, dtype=dtype)(x)
    shared = keras.layers.Dense(4, activation="tanh", dtype=dtype)  # on two branches
    pooled = keras.layers.Concatenate(dtype=dtype)([
        shared(keras.layers.GlobalAveragePooling1D(dtype=dtype)(x)),
        shared(keras.layers.GlobalMaxPooling1D(dtype=dtype)(x))])
    return keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(pooled))


def _volume(dtype):
    return keras.Sequential([
        keras.Input((3, 5, 5, 2), dtype=dtype),
        keras.layers.Conv3D(3, 2, dilation_rate=(1, 2, 2), padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.Reshape((5, 5, 9), dtype=dtype),
        keras.layers.Conv2DTranspose(2, 3, strides=2, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _floats(shape):
    return np.random.default_rng(0).normal(size=(BATCH,) + shape)


def _ids(shape):
    # Mostly frequent ids, some from the whole vocabulary, repeats within an example.
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 12, size=(BATCH,) + shape)
    rare = rng.random(ids.shape) < 0.4
    return np.where(rare, rng.integers(0, _VOCAB, size=ids.shape), ids).astype(np.float64)


# name: (builder, inputs, {layer class: handler}, needs oneDNN)
MODELS = {
    "vision": (_vision, lambda: _floats((10, 10, 3)),
               {"Conv2D": "conv2d", "DepthwiseConv2D": "depthwise_conv2d",
                "SeparableConv2D": "separable_conv2d", "LayerNormalization": "normalization",
                "Dense": "dense"}, False),
    "vision_grouped": (_vision_grouped, lambda: _floats((9, 9, 4)),
                       {"Conv2D": "conv2d", "GroupNormalization": "normalization",
                        "Dense": "dense"}, False),
    "text": (_text, lambda: _ids((8,)),
             {"Embedding": "embedding", "Conv1D": "conv1d", "LSTM": "rnn_rows",
              "EinsumDense": "einsum_dense", "LayerNormalization": "normalization",
              "TemperedSigmoid": "tempered_sigmoid", "Dense": "dense"}, False),
    "volume": (_volume, lambda: _floats((3, 5, 5, 2)),
               {"Conv3D": "conv3d", "Conv2DTranspose": "conv2d_transpose", "Dense": "dense"},
               False),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_every_trainable_layer_takes_its_handler(name):
    builder, _, expected, _ = MODELS[name]
    model = builder("float32")
    nested = keras_bridge.inside_recurrent_units(model)
    found = {}
    for layer in keras_bridge.flatten_layers(model):
        if keras_bridge.own_trainable_weights(layer) and id(layer) not in nested:
            found[type(layer).__name__] = layer_grads.lookup(layer)[0].name
    assert found == expected  # (a fixed TemperedSigmoid has no weights)


@pytest.mark.cover_each("name", ("num_microbatches", "static_batch"))
@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("num_microbatches,static_batch", [(None, True), (4, False)],
                         ids=["M=batch-static", "M=4-dynamic"])
def test_mixed_model_update_equals_per_microbatch_reference(name, num_microbatches,
                                                            static_batch):
    builder, inputs, _, onednn = MODELS[name]
    if onednn:
        skip_without_onednn_conv_gradients()
    y = np.random.default_rng(1).integers(0, 3, BATCH)
    assert_engine_matches_reference(seeded(builder), inputs(), y,
                                    num_microbatches=num_microbatches, static_batch=static_batch,
                                    cache_key=("mixed", name, num_microbatches))
