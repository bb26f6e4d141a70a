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
"""The conformance cases: small models per layer family, with the paths their handlers take.

Each case is a :class:`ConformanceCase`; ``CASES_BY_FAMILY`` groups them per layer family
and ``CASES`` holds them by name. Run by tests/test_conformance_<family>.py (each handler
against the float64 per-microbatch reference, tests/conformance_harness.py) and by
tests/test_sensitivity.py (neighbouring batches move the noised sum by at most C).
"""

import dataclasses
import functools
from typing import Any, Callable, FrozenSet, Mapping, Optional, Union

import numpy as np

from dp_reference import BATCH
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.layers import TemperedSigmoid, WeightStandardizedConv2D

_TF_OPS = {"native": False}
# Paths of a Dense-like row handler (Dense, EinsumDense).
_ROW_PATHS = {"auto": {}, "ghost": {"norm_path": "ghost"},
              "materialize": {"norm_path": "materialize"},
              "no-memory": {"materialize_max_bytes": 0}}
# Recurrent layers: TF's vectorized_map (the default on Keras 3) or a tf.map_fn
# (tf-keras' RNNs always take the tf.map_fn).
_RNN_PATHS = {"vectorized": {}, "map_fn": {"vectorize_recurrent": False}}
# Paths of the convolution handlers (Conv1D/2D, Conv2DTranspose; also the per-path
# reference tests of tests/test_conformance_conv.py): TF ops, each strategy forced, the
# native op.
CONV_PATHS = {
    "tf-auto": _TF_OPS,
    "tf-ghost": {**_TF_OPS, "norm_path": "ghost"},
    "tf-materialize": {**_TF_OPS, "norm_path": "materialize", "conv_blocks": False},
    # Strided layers' kept gradients from products per block of offsets (conv_grads.py).
    "tf-blocks": {**_TF_OPS, "norm_path": "materialize", "conv_blocks": True},
    "tf-depthwise": {**_TF_OPS, "norm_path": "depthwise"},
    "tf-chunks": {**_TF_OPS, "patch_chunk_bytes": 1, "depthwise_max_channel_pairs": 0},
    # Pattern A for the native op's automatic choice too (the order sets the pattern).
    "native-materialized": {"norm_path": "native", "native_materialize_min_rows": 0},
    "native-auto": {},
    "native-norms-only": {"norm_path": "native", "materialize_max_bytes": 0},
}

# ConvLSTM1D/2D/3D (conv_lstm.py): the convolution handlers' paths, the automatic choice first.
_CONV_LSTM_PATHS = {"auto": {}, **{k: v for k, v in CONV_PATHS.items() if k != "native-auto"}}

# Paths of the depthwise part (DepthwiseConv2D, SeparableConv2D): the native op (the
# automatic choice where it builds), the folded backprop in one call or in chunks of 3
# examples (padded chunks with a dynamic batch), image patches.
_DEPTHWISE_PATHS = {"auto": {}, "folded": _TF_OPS, "patches": {"norm_path": "materialize"},
                    "chunks": {**_TF_OPS, "depthwise_chunk": 3, "materialize_max_bytes": 0}}


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


def _weight_standardized(dtype):
    # The Conv2D paths on g/σ plus the standardization's terms: a large ε (0.05 against
    # Glorot variances ~0.04: ρ ≈ 1/2, so a wrong ε term shows), dilated "valid" without
    # bias and fan-in scaled, strided "same" before GroupNormalization (De et al.'s block).
    return keras.Sequential([
        keras.Input((8, 7, 2), dtype=dtype),
        WeightStandardizedConv2D(3, 3, padding="same", epsilon=0.05, activation="tanh",
                                 dtype=dtype),
        WeightStandardizedConv2D(4, 2, dilation_rate=2, use_bias=False, scaled=True,
                                 activation="tanh", dtype=dtype),
        WeightStandardizedConv2D(4, 3, strides=2, padding="same", dtype=dtype),
        keras.layers.GroupNormalization(groups=2, dtype=dtype),
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


def _keras3_lora_einsum_dense(dtype):
    """Keras 3 only: attention-style EinsumDense projections with LoRA (rank 2, the
    base kernels frozen): the LoRA handler on "abc,cde->abde" (bias "de") and
    "abcd,cde->abe" (no bias), one with its bias frozen too."""
    x_in = keras.Input((4, 6), dtype=dtype)
    project = keras.layers.EinsumDense("abc,cde->abde", output_shape=(4, 2, 3),
                                       bias_axes="de", lora_rank=2, dtype=dtype)
    merge = keras.layers.EinsumDense("abcd,cde->abe", output_shape=(4, 5),
                                     lora_rank=2, activation="tanh", dtype=dtype)
    frozen_bias = keras.layers.EinsumDense("abc,cd->abd", output_shape=(4, 3),
                                           bias_axes="d", lora_rank=2, dtype=dtype)
    x = frozen_bias(merge(project(x_in)))
    frozen_bias.bias.trainable = False
    model = keras.Model(x_in, keras.layers.Dense(3, dtype=dtype)(
        keras.layers.Flatten(dtype=dtype)(x)))
    rng = np.random.default_rng(1)
    for layer in (project, merge, frozen_bias):  # B = 0 at first: a zero LoRA gradient of A
        for variable in layer.trainable_weights:
            variable.assign(0.3 * rng.normal(size=variable.shape))
    return model


def _keras3_lora_and_frozen_bias(dtype):
    """Keras 3 only: LoRA layers (kernel = frozen kernel + trainable low-rank factors,
    `layer.kernel` a tensor) and a Dense whose bias alone is frozen. The LoRA Dense
    takes the LoRA handler (lora.py); the LoRA Embedding and the frozen-bias Dense
    are not the variables their handlers' math is for, so they take the generic VJP."""
    tokens = keras.Input((6,), dtype=dtype)
    x = keras.layers.Embedding(50, 4, lora_rank=2, dtype=dtype)(tokens)
    x = keras.layers.Dense(5, activation="tanh", lora_rank=2, dtype=dtype)(x)
    frozen_bias = keras.layers.Dense(4, activation="tanh", bias_initializer="ones",
                                     dtype=dtype)
    x = frozen_bias(keras.layers.Flatten(dtype=dtype)(x))
    frozen_bias.bias.trainable = False
    model = keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(x))
    rng = np.random.default_rng(0)
    for layer in model.layers:
        if getattr(layer, "lora_enabled", False):  # B = 0 at first: a zero LoRA gradient of A
            for variable in layer.trainable_weights:
                if not np.any(variable.numpy()):
                    variable.assign(0.3 * rng.normal(size=variable.shape))
    return model


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


def _conv1d(dtype):
    # The Conv1D handler (Conv2D paths on [B, 1, L, C]): causal dilated, strided "same".
    return keras.Sequential([
        keras.Input((10, 4), dtype=dtype),
        keras.layers.Conv1D(6, 3, dilation_rate=2, padding="causal", activation="tanh",
                            dtype=dtype),
        keras.layers.Conv1D(5, 3, strides=2, padding="same", activation="tanh", dtype=dtype),
        keras.layers.Conv1D(4, 2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _normalization(dtype):
    # LayerNormalization over the last axis and over two axes given out of order (γ of
    # shape [C, L], which both Kerases reshape, not transpose, onto the input's [L, C]),
    # GroupNormalization, variants without β or γ; γ and β random.
    inputs = keras.Input((6, 4), dtype=dtype)
    x = keras.layers.LayerNormalization(dtype=dtype)(inputs)
    x = keras.layers.Dense(4, activation="tanh", dtype=dtype)(x)
    x = keras.layers.GroupNormalization(groups=2, dtype=dtype)(x)
    x = keras.layers.Dense(4, activation="tanh", dtype=dtype)(x)
    x = keras.layers.LayerNormalization(axis=[-1, 1], center=False, dtype=dtype)(x)
    x = keras.layers.GroupNormalization(groups=4, scale=False, dtype=dtype)(x)
    x = keras.layers.Flatten(dtype=dtype)(x)
    model = keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(x))
    rng = np.random.default_rng(3)
    for layer in model.layers:
        for name in ("gamma", "beta"):
            if getattr(layer, name, None) is not None:
                variable = getattr(layer, name)
                variable.assign((1.0 if name == "gamma" else 0.0)
                                + 0.5 * rng.normal(size=variable.shape).astype(dtype))
    return model


def _grouped_conv1d(dtype):
    # Grouped Conv1D layers: the Conv1D handler, group by group (grouped.py).
    return keras.Sequential([
        keras.Input((10, 4), dtype=dtype),
        keras.layers.Conv1D(6, 3, strides=2, groups=2, activation="tanh", dtype=dtype),
        keras.layers.Conv1D(4, 2, dilation_rate=2, padding="causal", groups=2, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _depthwise(dtype):
    # depth_multiplier, "same"/"valid", strides, dilation, no bias.
    return keras.Sequential([
        keras.Input((7, 6, 2), dtype=dtype),
        keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="tanh",
                                     dtype=dtype),
        keras.layers.DepthwiseConv2D((2, 3), strides=2, activation="tanh", dtype=dtype),
        keras.layers.DepthwiseConv2D(2, dilation_rate=(2, 1), padding="same", depth_multiplier=3,
                                     use_bias=False, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _separable(dtype):
    return keras.Sequential([
        keras.Input((7, 6, 2), dtype=dtype),
        keras.layers.SeparableConv2D(3, 3, padding="same", depth_multiplier=2, activation="tanh",
                                     dtype=dtype),
        keras.layers.SeparableConv2D(4, (3, 2), strides=2, activation="tanh", dtype=dtype),
        keras.layers.SeparableConv2D(2, 2, dilation_rate=2, padding="same", use_bias=False,
                                     dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _conv1d_family(dtype):
    # DepthwiseConv1D, SeparableConv1D and Conv1DTranspose through their 2-D handlers
    # (layer_grads/conv1d.py): strided, dilated, output_padding, no bias; a causal
    # SeparableConv1D where the Keras has one (Keras 2; Keras 3 takes "same"/"valid" only).
    causal = "causal" if KERAS_MAJOR == 2 else "same"
    return keras.Sequential([
        keras.Input((12, 4), dtype=dtype),
        keras.layers.DepthwiseConv1D(3, padding="same", depth_multiplier=2, activation="tanh",
                                     dtype=dtype),
        keras.layers.SeparableConv1D(5, 3, strides=2, activation="tanh", dtype=dtype),
        keras.layers.SeparableConv1D(4, 2, dilation_rate=2, padding=causal, use_bias=False,
                                     activation="tanh", dtype=dtype),
        keras.layers.Conv1DTranspose(3, 3, strides=2, output_padding=1, activation="tanh",
                                     dtype=dtype),
        keras.layers.DepthwiseConv1D(2, dilation_rate=2, padding="same", use_bias=False,
                                     dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _time_distributed_rows(dtype):
    # Row handlers under TimeDistributed: on Keras 3 the layer is called once per time step
    # and the calls become one call of T rows per example (multi_call.rows_of_calls); on
    # Keras 2 the layer sees [B·T, ...] itself. Either way the handler sums rows per example.
    def spread(layer):
        return keras.layers.TimeDistributed(layer, dtype=dtype)
    return keras.Sequential([
        keras.Input((3, 6, 5, 2), dtype=dtype),
        spread(keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2,
                                            activation="tanh", dtype=dtype)),
        spread(keras.layers.SeparableConv2D(3, 3, strides=2, padding="same", activation="tanh",
                                            dtype=dtype)),
        spread(keras.layers.Conv2DTranspose(2, 3, strides=2, activation="tanh", dtype=dtype)),
        spread(keras.layers.Reshape((7 * 7, 2), dtype=dtype)),
        spread(keras.layers.Conv1D(3, 3, strides=2, activation="tanh", dtype=dtype)),
        spread(keras.layers.EinsumDense("abc,cd->abd", output_shape=(24, 2), bias_axes="d",
                                        activation="tanh", dtype=dtype)),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _conv_transpose(dtype):
    # Strided with output_padding and no bias, unstrided, strided "same". (Dilated:
    # _dilated_conv_transpose, which needs oneDNN on CPU.)
    return keras.Sequential([
        keras.Input((3, 2, 3), dtype=dtype),
        keras.layers.Conv2DTranspose(3, 3, strides=2, output_padding=1, use_bias=False,
                                     activation="tanh", dtype=dtype),
        keras.layers.Conv2DTranspose(4, (2, 3), activation="tanh", dtype=dtype),
        keras.layers.Conv2DTranspose(2, 3, strides=2, padding="same", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


class _ZeroInsertedConv2DTranspose(keras.layers.Conv2DTranspose):
    """A dilated Conv2DTranspose computed as an undilated one with the kernel's taps spread
    out by zeros (the definition of dilation): the float64 reference's stand-in, since
    oneDNN, which TF's CPU needs for dilated transposed convolutions, has no float64."""

    def call(self, inputs):
        kh, kw, filters, cin = self.kernel.shape
        dh, dw = self.dilation_rate
        spread = tf.pad(tf.reshape(self.kernel, [kh, 1, kw, 1, filters, cin]),
                        [[0, 0], [0, dh - 1], [0, 0], [0, dw - 1], [0, 0], [0, 0]])
        spread = tf.reshape(spread, [kh * dh, kw * dw, filters, cin])
        spread = spread[:(kh - 1) * dh + 1, :(kw - 1) * dw + 1]
        size = tf.shape(inputs)[1:3]
        if self.padding == "valid":
            size += tf.constant([(kh - 1) * dh, (kw - 1) * dw])
        outputs = tf.nn.conv2d_transpose(
            inputs, spread, tf.concat([tf.shape(inputs)[:1], size, [filters]], 0), 1,
            self.padding.upper())
        return self.activation(tf.nn.bias_add(outputs, self.bias))


def _dilated_conv_transpose(dtype):
    # "same" and "valid" (strides 1: TF allows no dilated strided transposed convolution).
    layer = _ZeroInsertedConv2DTranspose if dtype == "float64" else keras.layers.Conv2DTranspose
    return keras.Sequential([
        keras.Input((4, 3, 2), dtype=dtype),
        layer(3, 3, dilation_rate=2, padding="same", activation="tanh", dtype=dtype),
        layer(2, (2, 3), dilation_rate=2, dtype=dtype),  # (tf-keras: equal rates only)
        # (tf-keras' dilated Conv2DTranspose leaves the spatial sizes unknown: no Flatten)
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _grouped_conv2d(dtype):
    # Grouped Conv2D layers (dilated; strided "same"): the Conv2D handler, group by group
    # (grouped.py).
    return keras.Sequential([
        keras.Input((6, 6, 4), dtype=dtype),
        keras.layers.Conv2D(6, 3, groups=2, dilation_rate=2, activation="tanh", dtype=dtype),
        keras.layers.Conv2D(6, 2, strides=2, padding="same", groups=3,
                            dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _grouped_conv3d(dtype):
    return keras.Sequential([
        keras.Input((3, 4, 4, 4), dtype=dtype),
        keras.layers.Conv3D(4, 2, groups=2, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _locally_connected(dtype):
    # tf-keras' LocallyConnected1D/2D: implementation=1 (a kernel per output position) 2-D
    # strided, 1-D in both data formats, one without bias; implementation=2 (a masked dense
    # kernel) 2-D and 1-D channels_first. implementation=3's sparse matmul has no XLA kernel
    # (tests/test_conformance_xla.py compiles every case): its tests are in
    # tests/test_layer_grads_locally_connected.py.
    layers = keras.layers
    return keras.Sequential([
        keras.Input((7, 6, 2), dtype=dtype),
        layers.LocallyConnected2D(3, (3, 2), strides=(2, 1), activation="tanh", dtype=dtype),
        layers.Permute((3, 1, 2), dtype=dtype),
        layers.LocallyConnected2D(2, 2, data_format="channels_first", implementation=2,
                                  activation="tanh", dtype=dtype),
        layers.Reshape((2, 8), dtype=dtype),
        layers.LocallyConnected1D(3, 2, data_format="channels_first", use_bias=False,
                                  activation="tanh", dtype=dtype),
        layers.LocallyConnected1D(2, 2, strides=2, data_format="channels_first",
                                  implementation=2, activation="tanh", dtype=dtype),
        layers.Permute((2, 1), dtype=dtype),
        layers.LocallyConnected1D(4, 2, dtype=dtype),
        layers.Flatten(dtype=dtype),
        layers.Dense(3, dtype=dtype),
    ])


def _conv3d(dtype):
    # The Conv3D handler: "valid", strided "same" with an uneven kernel, dilated "same"
    # and dilated "valid" (patches from strided slices).
    return keras.Sequential([
        keras.Input((5, 4, 4, 2), dtype=dtype),
        keras.layers.Conv3D(3, 2, activation="tanh", dtype=dtype),
        keras.layers.Conv3D(4, (3, 2, 2), strides=(2, 1, 2), padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.Conv3D(2, 2, dilation_rate=(1, 2, 1), padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.Conv3D(2, (1, 2, 2), dilation_rate=(1, 2, 1), dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _own_call(cls):
    # A subclass with its own `call` (the same math): rnn_rows.py does not take it, so
    # it is the recurrent unit's per-example VJP (rnn.py) that runs.
    if cls not in _OWN_CALL:
        @functools.wraps(cls.call)  # Keras 3 reads the call's signature
        def call(self, *args, **kwargs):
            return cls.call(self, *args, **kwargs)

        # Registered: Keras 3's Bidirectional copies its layer through its config.
        _OWN_CALL[cls] = keras.utils.register_keras_serializable("tf_tempered_tests")(
            type(f"OwnCall{cls.__name__}", (cls,), {"call": call}))
    return _OWN_CALL[cls]


_OWN_CALL = {}


def _rnn(dtype):
    # The recurrent unit's VJP (its cells are not recorded): a backwards SimpleRNN, an
    # unrolled LSTM and a GRU (tf-keras: its fused kernel), as subclasses with a call
    # of their own.
    return keras.Sequential([
        keras.Input((5, 3), dtype=dtype),
        _own_call(keras.layers.SimpleRNN)(4, return_sequences=True, go_backwards=True,
                                          dtype=dtype),
        _own_call(keras.layers.LSTM)(3, return_sequences=True, unroll=True, dtype=dtype),
        _own_call(keras.layers.GRU)(3, dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _rnn_rows(dtype):
    # rnn_rows.py: a backwards SimpleRNN, an unrolled LSTM, a GRU returning its state, a
    # backwards GRU with reset_after=False, RNN(LSTMCell), a ReLU SimpleRNN shared by two calls.
    inputs = keras.Input((5, 3), dtype=dtype)
    x = keras.layers.SimpleRNN(4, return_sequences=True, go_backwards=True, dtype=dtype)(inputs)
    x = keras.layers.LSTM(3, return_sequences=True, unroll=True, dtype=dtype)(x)
    seq, state = keras.layers.GRU(3, return_sequences=True, return_state=True, dtype=dtype)(x)
    seq = keras.layers.GRU(3, reset_after=False, return_sequences=True, go_backwards=True,
                           dtype=dtype)(seq)
    seq = keras.layers.RNN(keras.layers.LSTMCell(3, dtype=dtype), return_sequences=True,
                           dtype=dtype)(seq)
    shared = keras.layers.SimpleRNN(2, activation="relu", dtype=dtype)
    merged = keras.layers.Concatenate(dtype=dtype)([shared(seq), shared(x), state])
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(merged))


def _rnn_rows_masked(dtype):
    # Embedding(mask_zero) masks the padded steps of a GRU (sequences, zero outputs at
    # masked steps), a GRU with reset_after=False, a Bidirectional SimpleRNN and a
    # backwards LSTM without bias.
    tokens = keras.Input((5,), dtype=dtype)
    x = keras.layers.Embedding(20, 4, mask_zero=True, dtype=dtype)(tokens)
    x = keras.layers.GRU(3, return_sequences=True, zero_output_for_mask=True, dtype=dtype)(x)
    x = keras.layers.GRU(3, reset_after=False, return_sequences=True, dtype=dtype)(x)
    x = keras.layers.Bidirectional(keras.layers.SimpleRNN(2, return_sequences=True,
                                                          dtype=dtype), dtype=dtype)(x)
    x = keras.layers.LSTM(3, go_backwards=True, use_bias=False, dtype=dtype)(x)
    return keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(x))


def _rnn_masked_bidirectional(dtype):
    # Embedding(mask_zero) masks the padded steps of a Bidirectional LSTM (its two
    # LSTMs with a call of their own: the recurrent unit's VJP).
    tokens = keras.Input((4,), dtype=dtype)
    x = keras.layers.Embedding(20, 4, mask_zero=True, dtype=dtype)(tokens)
    x = keras.layers.Bidirectional(_own_call(keras.layers.LSTM)(3, dtype=dtype),
                                   dtype=dtype)(x)
    return keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(x))


def _rnn_states(dtype):
    # initial_state from another layer, return_state feeding the head, a ConvLSTM1D
    # (conv_lstm.py), and a SimpleRNN with a call of its own (the recurrent unit's VJP)
    # started from a state computed by another layer.
    inputs = keras.Input((4, 5, 2), dtype=dtype)
    seq = keras.layers.ConvLSTM1D(2, 2, dtype=dtype)(inputs)  # [B, 4, 2]
    first = keras.layers.Lambda(lambda t: t[:, 0], dtype=dtype)(seq)
    h0 = keras.layers.Dense(3, activation="tanh", dtype=dtype)(first)
    out, h, c = keras.layers.LSTM(3, return_state=True, dtype=dtype)(seq, initial_state=[h0, h0])
    own = _own_call(keras.layers.SimpleRNN)(3, dtype=dtype)(seq, initial_state=[h0])
    merged = keras.layers.Concatenate(dtype=dtype)([out, c, own])
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(merged))


def _conv_lstm(dtype):
    # conv_lstm.py: a strided ConvLSTM2D (sequences), a dilated backwards one without bias
    # started from states computed by another layer, a ConvLSTM1D returning its states and a
    # tiny ConvLSTM3D (last outputs), on the second one's sequence.
    layers = keras.layers
    inputs = keras.Input((3, 6, 5, 2), dtype=dtype)
    x = layers.ConvLSTM2D(3, 3, strides=2, padding="same", return_sequences=True,
                          dtype=dtype)(inputs)  # [B, 3, 3, 3, 3]
    first = layers.Lambda(lambda t: t[:, 0], dtype=dtype)(x)
    s0 = layers.Dense(2, activation="tanh", dtype=dtype)(first)  # [B, 3, 3, 2]
    x = layers.ConvLSTM2D(2, 2, dilation_rate=2, padding="same", use_bias=False,
                          go_backwards=True, return_sequences=True, dtype=dtype)(
                              x, initial_state=[s0, s0])  # [B, 3, 3, 3, 2]
    last, _, c = layers.ConvLSTM1D(2, 2, return_state=True, dtype=dtype)(
        layers.Reshape((3, 9, 2), dtype=dtype)(x))  # [B, 8, 2] each
    volume = layers.ConvLSTM3D(1, 2, dtype=dtype)(
        layers.Reshape((3, 3, 3, 2, 1), dtype=dtype)(x))  # [B, 2, 2, 1, 1]
    merged = layers.Concatenate(dtype=dtype)([layers.Flatten(dtype=dtype)(t)
                                              for t in (last, c, volume)])
    return keras.Model(inputs, layers.Dense(3, dtype=dtype)(merged))


def _padded_ids(shape, seed):
    # Ids 1..19 with padded (id 0) tails of different lengths.
    ids = np.random.default_rng(seed).integers(1, 20, size=(BATCH,) + shape)
    lengths = np.arange(BATCH) % shape[-1] + 1
    return np.where(np.arange(shape[-1]) < lengths[:, None], ids, 0)


def _floats(shape, seed):
    return np.random.default_rng(seed).normal(size=(BATCH,) + shape)


def _ids(shape, seed, vocab):
    # Mostly a few small ids (duplicates within and across examples), some large ones.
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 4, size=(BATCH,) + shape)
    rare = rng.random(ids.shape) < 0.3
    return np.where(rare, rng.integers(vocab - 3, vocab, size=ids.shape), ids)


@dataclasses.dataclass(frozen=True)
class ConformanceCase:
    """One small model holding a layer family, and what the engine must do with it.

    name: the case's id in test ids (``conv2d``, ``rnn_states``, ...).
    build: dtype -> a fresh Keras model ("float32" for the engine, "float64" for the
        reference; the drivers seed it).
    inputs: seed -> the batch's inputs x, BATCH examples (the drivers draw the labels).
    paths: path name -> EngineOptions keyword arguments, every path the handler can take;
        the first is the handler's automatic choice (it gets pattern A, see
        conformance_harness.py).
    expected_handlers: layer class name -> the registered handler's name (or a frozenset
        of names when layers of one class take different handlers).
    recurrent_vjp: the recurrent unit's per-example VJP (layer_grads/rnn.py) runs, which is
        slow to trace vectorized (TF's vectorized_map of a time loop, 15-40 s a step on 2
        busy CPUs): the "vectorized" path runs one (M, batch kind) pair per such case,
        pattern A's pairs spread over them; "map_fn" (seconds) runs pattern A or B in turn;
        one two-pass mode only; the sensitivity test takes the tf.map_fn.
    default_paths: the paths the default run takes (None: every path); the others run with
        --extended.
    onednn_only: dilated transposed convolutions, which Keras 3 differentiates on CPU only
        with oneDNN (dp_reference.onednn_conv_gradients).
    keras3_only: uses Keras 3 features (LoRA, per-variable trainable flags); not a case on
        Keras 2.
    keras2_only: uses layers only tf-keras has (LocallyConnected1D/2D); not a case on Keras 3.
    """

    name: str
    build: Callable[[str], Any]
    inputs: Callable[[int], np.ndarray]
    paths: Mapping[str, Mapping[str, Any]]
    expected_handlers: Mapping[str, Union[str, FrozenSet[str]]]
    recurrent_vjp: bool = False
    default_paths: Optional[FrozenSet[str]] = None
    onednn_only: bool = False
    keras3_only: bool = False
    keras2_only: bool = False


_Case = ConformanceCase

# The cases of each layer family, one test file each (tests/test_conformance_<family>.py).
# The order matters: the two-pass modes rotate the (M, batch kind) pairs over the cases in
# this order, and the default run takes each pair's first case (conformance_harness.py).
_FAMILIES = {
    "dense": (
        _Case("dense", _dense, lambda s: _floats((4, 6), s), _ROW_PATHS, {"Dense": "dense"}),
        _Case("einsum_dense", _einsum_dense, lambda s: _floats((4, 6), s), _ROW_PATHS,
              {"EinsumDense": "einsum_dense", "Dense": "dense"}),
        _Case("einsum_dense_row_bias", _einsum_dense_row_bias, lambda s: _floats((4, 6), s),
              _ROW_PATHS, {"EinsumDense": "einsum_dense", "Dense": "dense"}),
        _Case("transformer_block", _transformer_block, lambda s: _ids((5,), s, 50),
              {"auto": {}, "ghost": {"norm_path": "ghost"}},
              {"EinsumDense": "einsum_dense", "Embedding": "embedding",
               "LayerNormalization": "normalization", "Dense": "dense"}),
        # Keras 2 has neither LoRA nor per-variable trainable flags.
        _Case("keras3_lora_frozen_bias", _keras3_lora_and_frozen_bias,
              lambda s: _ids((6,), s, 50), {"auto": {}},
              {"Embedding": "generic",
               "Dense": frozenset({"generic", "dense", "lora_dense"})},
              keras3_only=True),
        _Case("keras3_lora_einsum_dense", _keras3_lora_einsum_dense,
              lambda s: _floats((4, 6), s), _ROW_PATHS,
              {"EinsumDense": "lora_einsum_dense", "Dense": "dense"}, keras3_only=True),
    ),
    "conv": (
        _Case("conv2d", _conv2d, lambda s: _floats((8, 7, 2), s), CONV_PATHS,
              {"Conv2D": "conv2d", "Dense": "dense"}),
        _Case("conv1d", _conv1d, lambda s: _floats((10, 4), s), CONV_PATHS,
              {"Conv1D": "conv1d", "Dense": "dense"}),
        _Case("conv3d", _conv3d, lambda s: _floats((5, 4, 4, 2), s),
              {**_ROW_PATHS, "chunks": {"patch_chunk_bytes": 1}},
              {"Conv3D": "conv3d", "Dense": "dense"}),
        # Two of the Conv2D paths (the conv2d case runs them all): per-example kernel
        # gradients kept (depthwise backprop, per-step choices) and ghost norms.
        _Case("weight_standardized", _weight_standardized, lambda s: _floats((8, 7, 2), s),
              {"tf-auto": _TF_OPS, "tf-ghost": CONV_PATHS["tf-ghost"]},
              {"WeightStandardizedConv2D": "weight_standardized_conv2d",
               "GroupNormalization": "normalization", "Dense": "dense"}),
        _Case("grouped_conv1d", _grouped_conv1d, lambda s: _floats((10, 4), s), {"auto": {}},
              {"Conv1D": "conv1d", "Dense": "dense"}),
        _Case("grouped_conv2d", _grouped_conv2d, lambda s: _floats((6, 6, 4), s), CONV_PATHS,
              {"Conv2D": "conv2d", "Dense": "dense"}),
        _Case("grouped_conv3d", _grouped_conv3d, lambda s: _floats((3, 4, 4, 4), s),
              {"auto": {}}, {"Conv3D": "conv3d", "Dense": "dense"}),
        _Case("locally_connected", _locally_connected, lambda s: _floats((7, 6, 2), s),
              {"auto": {}, "ghost": {"norm_path": "ghost"},
               "materialize": {"norm_path": "materialize"}},
              {"LocallyConnected2D": "locally_connected",
               "LocallyConnected1D": "locally_connected", "Dense": "dense"}, keras2_only=True),
    ),
    "conv_transpose": (
        _Case("conv_transpose", _conv_transpose, lambda s: _floats((3, 2, 3), s), CONV_PATHS,
              {"Conv2DTranspose": "conv2d_transpose", "Dense": "dense"}),
        _Case("dilated_conv_transpose", _dilated_conv_transpose,
              lambda s: _floats((4, 3, 2), s), CONV_PATHS,
              {"Conv2DTranspose": "conv2d_transpose", "Dense": "dense"}, onednn_only=True),
    ),
    "depthwise": (
        _Case("depthwise", _depthwise, lambda s: _floats((7, 6, 2), s), _DEPTHWISE_PATHS,
              {"DepthwiseConv2D": "depthwise_conv2d", "Dense": "dense"}),
        _Case("separable", _separable, lambda s: _floats((7, 6, 2), s),
              {**_DEPTHWISE_PATHS, "ghost": {"norm_path": "ghost"}},
              {"SeparableConv2D": "separable_conv2d", "Dense": "dense"}),
        _Case("conv1d_family", _conv1d_family, lambda s: _floats((12, 4), s),
              {"auto": {}, "tf-auto": CONV_PATHS["tf-auto"],
               "tf-materialize": CONV_PATHS["tf-materialize"]},
              {"DepthwiseConv1D": "depthwise_conv1d", "SeparableConv1D": "separable_conv1d",
               "Conv1DTranspose": "conv1d_transpose", "Dense": "dense"}),
    ),
    "embedding": (
        _Case("embedding", _embedding, lambda s: _ids((6,), s, _VOCAB), {"auto": {}},
              {"Embedding": "embedding", "Dense": "dense"}),
    ),
    "normalization": (
        _Case("normalization", _normalization, lambda s: _floats((6, 4), s), {"auto": {}},
              {"LayerNormalization": "normalization", "GroupNormalization": "normalization",
               "Dense": "dense"}),
    ),
    "generic": (
        _Case("generic", _generic, lambda s: _floats((6,), s), {"auto": {}},
              {"_DenseWithOwnCall": "generic", "LayerNormalization": "normalization",
               "TemperedSigmoid": "tempered_sigmoid", "Dense": "dense"}),
        _Case("time_distributed_rows", _time_distributed_rows,
              lambda s: _floats((3, 6, 5, 2), s),
              {"auto": {}, "tf-ghost": CONV_PATHS["tf-ghost"]},
              {"DepthwiseConv2D": "depthwise_conv2d", "SeparableConv2D": "separable_conv2d",
               "Conv2DTranspose": "conv2d_transpose", "Conv1D": "conv1d",
               "EinsumDense": "einsum_dense", "Dense": "dense"}),
    ),
    "recurrent": (
        _Case("rnn", _rnn, lambda s: _floats((5, 3), s), _RNN_PATHS,
              {"OwnCallSimpleRNN": "rnn", "OwnCallLSTM": "rnn", "OwnCallGRU": "rnn",
               "Dense": "dense"}, recurrent_vjp=True),
        _Case("rnn_rows", _rnn_rows, lambda s: _floats((5, 3), s), _ROW_PATHS,
              {"SimpleRNN": "rnn_rows", "LSTM": "rnn_rows", "GRU": "rnn_rows",
               "RNN": "rnn_rows", "Dense": "dense"}),
        _Case("rnn_rows_masked", _rnn_rows_masked, lambda s: _padded_ids((5,), s), _ROW_PATHS,
              {"Embedding": "embedding", "GRU": "rnn_rows", "SimpleRNN": "rnn_rows",
               "LSTM": "rnn_rows", "Dense": "dense"}),
        _Case("rnn_masked_bidirectional", _rnn_masked_bidirectional,
              lambda s: _padded_ids((4,), s), _RNN_PATHS,
              {"Embedding": "embedding", "OwnCallLSTM": "rnn", "Dense": "dense"},
              recurrent_vjp=True),
        _Case("rnn_states", _rnn_states, lambda s: _floats((4, 5, 2), s), _RNN_PATHS,
              {"ConvLSTM1D": "conv_lstm", "LSTM": "rnn_rows", "OwnCallSimpleRNN": "rnn",
               "Dense": "dense"}, recurrent_vjp=True),
        # The convolution handlers' paths (each on the input and the recurrent convolution);
        # the default run takes the automatic choice and TF ops only.
        _Case("conv_lstm", _conv_lstm, lambda s: _floats((3, 6, 5, 2), s), _CONV_LSTM_PATHS,
              {"ConvLSTM2D": "conv_lstm", "ConvLSTM1D": "conv_lstm",
               "ConvLSTM3D": "conv_lstm", "Dense": "dense"},
              default_paths=frozenset({"auto", "tf-auto"})),
    ),
}

# The cases this Keras runs, per family and by name (family order, then each family's).
CASES_BY_FAMILY = {family: tuple(case for case in cases
                                 if not (case.keras3_only and KERAS_MAJOR == 2)
                                 and not (case.keras2_only and KERAS_MAJOR == 3))
                   for family, cases in _FAMILIES.items()}
CASES = {case.name: case for cases in CASES_BY_FAMILY.values() for case in cases}
FAMILY_OF = {case.name: family for family, cases in CASES_BY_FAMILY.items() for case in cases}
