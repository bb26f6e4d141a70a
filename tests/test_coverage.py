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
"""The DP engine's coverage checks: no trainable variable is trained without its per-example gradients."""

import logging

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tensorflow_privacy, tf
from dp_reference import _seeded, assert_engine_matches_reference
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions
from tf_tempered.privacy import UnsupportedLayerError, make_private

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
BATCH = 16


def _update(build, private, x, y):
    """Weight changes of one DP-SGD step (noise 0, clip 0.3, lr 1) on a fresh `build()`."""
    keras.utils.set_random_seed(0)
    model = build()
    # The reference (not private) is TF Privacy's own DP path.
    optimizer_class = DPKerasSGDOptimizer if private else tensorflow_privacy.DPKerasSGDOptimizer
    if private:
        make_private(model)
    model.compile(optimizer=optimizer_class(l2_norm_clip=0.3, noise_multiplier=0.0,
                                            learning_rate=1.0), loss=LOSS)
    before = model.get_weights()
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    return [a - b for a, b in zip(model.get_weights(), before)], model


def _shared_dense_twice(dtype):
    # The same Dense on its own output: per example, the two calls' contributions add up.
    inputs = keras.Input((4,), dtype=dtype)
    dense = keras.layers.Dense(4, activation="tanh", dtype=dtype)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(dense(dense(inputs))))


def _siamese(dtype):
    # One tower on two inputs (a siamese net), merged.
    inputs = keras.Input((2, 5), dtype=dtype)
    tower = keras.layers.Dense(4, activation="tanh", dtype=dtype)
    left = tower(keras.layers.Lambda(lambda t: t[:, 0], dtype=dtype)(inputs))
    right = tower(keras.layers.Lambda(lambda t: t[:, 1], dtype=dtype)(inputs))
    merged = keras.layers.Concatenate(dtype=dtype)([left, right])
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(merged))


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("builder, shape", [(_shared_dense_twice, (4,)), (_siamese, (2, 5))],
                         ids=["dense-twice", "siamese"])
def test_shared_layer_equals_reference(builder, shape, num_microbatches, static_batch):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(BATCH,) + shape), rng.integers(0, 3, BATCH)
    assert_engine_matches_reference(_seeded(builder), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch)


def test_shared_layer_on_rows_that_are_not_examples_is_refused():
    # The second call sees [2·B, 4] rows: they cannot be paired with the examples.
    reshape = keras.ops.reshape if KERAS_MAJOR == 3 else tf.reshape
    inputs = keras.Input((2, 4))
    dense = keras.layers.Dense(4)
    first = dense(keras.layers.Lambda(lambda t: t[:, 0])(inputs))
    second = dense(keras.layers.Lambda(lambda t: reshape(t, (-1, 4)))(inputs))
    second = keras.layers.Lambda(lambda t: reshape(t, (-1, 8)))(second)
    merged = keras.layers.Concatenate()([first, second])
    model = make_private(keras.Model(inputs, keras.layers.Dense(3)(merged)))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    before = model.get_weights()
    data = tf.data.Dataset.from_tensor_slices((np.ones((8, 2, 4), np.float32), np.zeros(8)))
    with pytest.raises(UnsupportedLayerError, match="called more than once per step.*first axis"):
        model.fit(data.batch(8, drop_remainder=True), verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def _recurrent(rnn):
    def build(dtype):
        return keras.Sequential([keras.Input((5, 3), dtype=dtype), rnn(dtype),
                                 keras.layers.Dense(3, dtype=dtype)])

    return build


@pytest.mark.parametrize("rnn", [
# tf-keras' fused kernels use the cell's weights without calling the cell; Keras
# 3 calls it inside a tf.while_loop: the layer's call is recorded (an LSTM's by
# rnn_rows.py's own forward pass), its cells' weights covered by it.
    # (SimpleRNN, LSTM, GRU, Bidirectional, ConvLSTM1D: tests/test_conformance_recurrent.py)
    lambda dtype: keras.layers.LSTM(4, dtype=dtype),
    lambda dtype: keras.layers.RNN(keras.layers.StackedRNNCells(
        [keras.layers.GRUCell(3, dtype=dtype), keras.layers.SimpleRNNCell(2, dtype=dtype)]),
        dtype=dtype),
], ids=["lstm", "stacked-cells"])
def test_recurrent_layers_train_exactly(rnn):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(BATCH, 5, 3)), rng.integers(0, 3, BATCH)
    assert_engine_matches_reference(_seeded(_recurrent(rnn)), x, y, num_microbatches=4,
                                    static_batch=True)


def test_recurrent_layers_are_logged_as_taking_the_vjp(caplog):
    # An RNN of stacked cells takes the recurrent unit's VJP (logged); the LSTM after it
    # does not (rnn_rows.py), nor would RNN(GRUCell(3)).
    model = make_private(_recurrent(lambda dtype: keras.Sequential([
        keras.layers.RNN(keras.layers.StackedRNNCells([keras.layers.GRUCell(3, dtype=dtype)]),
                         return_sequences=True, name="bi_gru", dtype=dtype),
        keras.layers.LSTM(2, dtype=dtype)]))("float32"),
        options=EngineOptions(vectorize_recurrent=False))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    with caplog.at_level(logging.INFO, logger="tf_tempered.privacy.engine"):
        model.fit(np.ones((4, 5, 3)), np.zeros(4), batch_size=4, verbose=0)
    lines = [r.getMessage() for r in caplog.records if "per-layer VJP" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("for: bi_gru (RNN)"), lines


def test_shared_recurrent_layer_sums_its_calls():
    # One LSTM on two halves of the sequence: per example, the two calls add up.
    def build(dtype):
        inputs = keras.Input((6, 3), dtype=dtype)
        lstm = keras.layers.LSTM(3, dtype=dtype)
        left = lstm(keras.layers.Lambda(lambda t: t[:, :3], dtype=dtype)(inputs))
        right = lstm(keras.layers.Lambda(lambda t: t[:, 3:], dtype=dtype)(inputs))
        merged = keras.layers.Concatenate(dtype=dtype)([left, right])
        return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(merged))

    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(BATCH, 6, 3)), rng.integers(0, 3, BATCH)
    assert_engine_matches_reference(_seeded(build), x, y)


class _CellLoop(keras.layers.Layer):
    """Runs a recurrent cell in a Python loop of its own: not a keras RNN layer."""

    def __init__(self):
        super().__init__()
        self.cell = keras.layers.SimpleRNNCell(3)

    def call(self, inputs):
        state = [inputs[:, 0, :3] * 0]
        for t in range(inputs.shape[1]):
            output, state = self.cell(inputs[:, t], state)
        return output


class _RNNInMapFn(keras.layers.Layer):
    """Applies an LSTM to each example inside tf.map_fn: a loop the engine cannot record."""

    def __init__(self):
        super().__init__()
        self.lstm = keras.layers.LSTM(3)

    def call(self, inputs):
        return tf.map_fn(lambda x: self.lstm(x[None])[0], inputs)


@pytest.mark.parametrize("layer,match", [
    (lambda: keras.layers.LSTM(3, stateful=True), "'lstm' .*stateful=True.*Fix: stateful=False"),
    (lambda: keras.layers.GRU(3, dropout=0.2), "'gru' .*dropout=0.2.*different gradient.*Fix"),
    (lambda: keras.layers.Bidirectional(keras.layers.SimpleRNN(3, recurrent_dropout=0.1)),
     "'forward_simple_rnn' .*recurrent_dropout=0.1.*Fix"),
    (_CellLoop, "'simple_rnn_cell' .*recurrent cell called outside a keras.layers.RNN.*"
                "keras.layers.RNN\\(cell\\)"),
    (_RNNInMapFn, "'lstm' .*inside a loop or nested function"),
], ids=["stateful", "dropout", "bidirectional-recurrent-dropout", "cell-outside-rnn",
        "rnn-in-map-fn"])
def test_what_stays_refused_is_refused_with_the_fix(layer, match):
    # A fixed batch size: a stateful RNN needs one.
    model = make_private(keras.Sequential([keras.Input((5, 3), batch_size=4), layer(),
                                           keras.layers.Dense(3)]))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    before = model.get_weights()
    with pytest.raises(UnsupportedLayerError, match=match):
        model.fit(np.ones((4, 5, 3)), np.zeros(4), batch_size=4, verbose=0)
    for b, a in zip(before, model.get_weights()):  # refused before the first update
        np.testing.assert_array_equal(a, b)


def _masked_lstm():
    tokens = keras.Input((7,))
    x = keras.layers.Embedding(30, 4, mask_zero=True)(tokens)
    x = keras.layers.LSTM(5)(x)
    return keras.Model(tokens, keras.layers.Dense(3)(x))


def _bidirectional_gru():
    return keras.Sequential([keras.Input((6, 3)), keras.layers.Bidirectional(keras.layers.GRU(4)),
                             keras.layers.Dense(3)])


@pytest.mark.tf_privacy
@pytest.mark.parametrize("build,x", [
    (_masked_lstm, np.where(np.arange(7) < np.arange(BATCH)[:, None] % 7 + 1,
                            np.random.default_rng(6).integers(1, 30, (BATCH, 7)), 0)),
    (_bidirectional_gru, np.random.default_rng(7).normal(size=(BATCH, 6, 3))),
], ids=["embedding-mask-lstm", "bidirectional-gru"])
def test_recurrent_models_match_tf_privacy(build, x):
    # Held out from the conformance cases: TF Privacy's own DP path (noise 0), whose
    # per-microbatch gradients back-propagate through the fused LSTM/GRU kernels.
    y = np.arange(BATCH) % 3
    x = x.astype("float32")
    reference, _ = _update(build, False, x, y)
    ours, _ = _update(build, True, x, y)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


class _WithUnusedLayer(keras.Model):
    """A built layer the forward pass does not use: TF Privacy's zero gradient, no refusal."""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(5, activation="tanh")
        self.unused = keras.layers.Dense(5)
        self.out = keras.layers.Dense(3)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


@pytest.mark.tf_privacy
def test_unused_layer_gets_zero_gradient_like_tf_privacy():
    x = np.random.default_rng(3).normal(size=(BATCH, 4)).astype("float32")
    y = np.arange(BATCH) % 3

    def build():
        model = _WithUnusedLayer()
        model(tf.zeros([1, 4]))
        model.unused(tf.zeros([1, 4]))  # built (it has weights), never used in training
        return model

    reference, model = _update(build, False, x, y)
    ours, _ = _update(build, True, x, y)
    unused = {id(w) for w in model.unused.weights}
    assert sum(np.abs(r).sum() for r, w in zip(reference, model.weights) if id(w) in unused) == 0
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


class TiedEmbeddings(keras.Model):
    """Input and output embeddings tied: the table is also read outside the Embedding's call."""

    def __init__(self):
        super().__init__()
        self.embed = keras.layers.Embedding(20, 8)
        self.hidden = keras.layers.Dense(8, activation="tanh")

    def call(self, ids):
        h = self.hidden(tf.reduce_mean(self.embed(ids), axis=1))
        return tf.matmul(h, self.embed.embeddings, transpose_b=True)


@pytest.mark.parametrize("run_eagerly", [False, True])
def test_weight_read_outside_its_layer_call_is_refused_before_any_update(run_eagerly):
    # Its gradient from the tied projection would be missing from the norm: refuse. Eagerly
    # the graph the check reads was not there: it trained with that gradient missing.
    model = TiedEmbeddings()
    model(np.zeros((2, 5), "int32"))
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS, run_eagerly=run_eagerly)
    before = model.get_weights()
    ids = np.random.default_rng(0).integers(0, 20, (8, 5))
    with pytest.raises(UnsupportedLayerError,
                       match="embeddings[^']*' of layer 'embedding' is used in the forward pass "
                             "outside that layer's call.*tied"):
        model.fit(ids, np.arange(8), batch_size=4, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3 keeps such a weight among its non-trainable ones")
def test_a_weight_made_trainable_after_creation_is_refused_naming_the_fix():
    class CreatedFrozen(keras.layers.Layer):
        def build(self, input_shape):
            self.w = self.add_weight(shape=(input_shape[-1], 3), trainable=False, name="w")

        def call(self, x):
            return tf.matmul(x, self.w)

    layer = CreatedFrozen()
    model = keras.Sequential([keras.Input((4,)), layer])
    layer.w.trainable = True  # not watched by TF's tapes: plain Keras does not train it
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    with pytest.raises(UnsupportedLayerError, match="created with trainable=False and made "
                       r"trainable later.*Fix: create it with add_weight\(trainable=True\)"):
        model.fit(np.ones((8, 4), np.float32), np.zeros(8), batch_size=4, verbose=0)


def test_a_models_own_weight_is_refused_naming_the_fix_that_applies():
    # Before: "Call make_private(model) after building the model, or move the variable into
    # a layer", to a model built long before make_private (probe V, F4).
    class Scaled(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(3)

        def build(self, input_shape):
            self.scale = self.add_weight(shape=(3,), initializer="ones", name="scale")
            self.dense.build(input_shape)

        def call(self, x):
            return self.dense(x) * self.scale

    model = Scaled()
    model(np.ones((1, 4), np.float32))
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match=r"'[^']*scale[^']*' was created by the "
                       r"model .* itself.*Fix: create it in a keras Layer of its own"):
        model.fit(np.ones((8, 4), np.float32), np.zeros(8), batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def _spectral_normalized(dtype="float32"):
    return keras.Sequential([
        keras.Input((6,), dtype=dtype),
        keras.layers.SpectralNormalization(keras.layers.Dense(5, activation="tanh", dtype=dtype),
                                           dtype=dtype),
        keras.layers.Dense(3, dtype=dtype)])


def _stopped_tie():
    """Tied embeddings whose output projection reads the table under tf.stop_gradient."""
    class StoppedTie(TiedEmbeddings):
        def call(self, ids):
            h = self.hidden(tf.reduce_mean(self.embed(ids), axis=1))
            return tf.matmul(h, tf.stop_gradient(self.embed.embeddings), transpose_b=True)
    return StoppedTie()


@pytest.mark.parametrize("build", [_spectral_normalized, _stopped_tie],
                         ids=["spectral-normalization", "stop-gradient-tie"])
def test_a_weight_read_that_carries_no_gradient_outside_its_call_trains_exactly(build):
    # SpectralNormalization reads its wrapped layer's kernel outside that layer's call,
    # but only to compare it with 0 and to assign the normalized kernel, which the call
    # then reads: refused as a tied weight before, though that read adds no gradient.
    rng = np.random.default_rng(2)
    if build is _spectral_normalized:
        x, y = rng.normal(size=(8, 6)).astype(np.float32), rng.integers(0, 3, 8)
    else:
        x, y = rng.integers(0, 20, (8, 5)), rng.integers(0, 20, 8)
    model = build()
    model(x[:1])
    initial = [v.numpy() for v in model.variables]

    def restore():
        for v, value in zip(model.variables, initial):
            v.assign(value)

    per_example = []
    for i in range(len(x)):  # each example from the same state, as the batch's one forward
        restore()
        with tf.GradientTape() as tape:
            loss = LOSS(y[i:i + 1], model(x[i:i + 1], training=True))
        per_example.append([tf.convert_to_tensor(g).numpy()
                            for g in tape.gradient(loss, model.trainable_variables)])
    norms = np.array([np.sqrt(sum(np.sum(g ** 2) for g in grads)) for grads in per_example])
    clip = float(np.median(norms))
    assert 0 < np.mean(norms > clip) < 1
    reference = [-sum(min(1.0, clip / n) * grads[k] for n, grads in zip(norms, per_example))
                 / len(x) for k in range(len(model.trainable_variables))]
    restore()
    before = [v.numpy() for v in model.trainable_variables]
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LOSS)
    model.fit(x, y, batch_size=len(x), shuffle=False, verbose=0)
    ours = [v.numpy() for v in model.trainable_variables]
    # The update applies to the variables as the step's forward left them (the
    # normalized kernel): that state, plus the clipped mean.
    restore()
    model(x, training=True)
    after_forward = [v.numpy() for v in model.trainable_variables]
    scale = max(np.abs(r).max() for r in reference)
    for o, a, r in zip(ours, after_forward, reference):
        np.testing.assert_allclose(o - a, r, rtol=0, atol=1e-5 * scale)
    assert any(np.abs(a - b).max() > 0 for a, b in zip(after_forward, before)) == \
        (build is _spectral_normalized)
