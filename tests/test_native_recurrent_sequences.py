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
"""The native LSTM and GRU time loops (privacy/native/cc/lstm_sequence.cc, gru_sequence.cc)
against TF ops, forward and backward, and when the rnn_rows handler takes them."""

import functools
import warnings

import numpy as np
import pytest
from native_calls import record_calls

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import EngineOptions, make_private, native
from tf_tempered.privacy.native import library

needs_op = pytest.mark.skipif(library._compiler() is None,  # pylint: disable=protected-access
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")


def _tf_loop(a, u, h0, c0):
    """(h, c) [B, T, H] by Keras' LSTM step in TF ops (gates i, f, g, o)."""
    h, c, hs, cs = h0, c0, [], []
    for t in range(a.shape[1]):
        i, f, g, o = tf.split(a[:, t] + tf.matmul(h, u), 4, axis=-1)
        c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
        h = tf.sigmoid(o) * tf.tanh(c)
        hs.append(h)
        cs.append(c)
    return tf.stack(hs, 1), tf.stack(cs, 1)


def _tf_gru_loop(a, u, recurrent_bias, h0, reset_after=True):
    """(h [B, T, H], reset gates) by Keras' GRU step in TF ops."""
    h, hs, rs = h0, [], []
    units = h0.shape[-1]
    for t in range(a.shape[1]):
        x_z, x_r, x_h = tf.split(a[:, t], 3, axis=-1)
        if reset_after:
            q_z, q_r, q_h = tf.split(tf.matmul(h, u) + recurrent_bias, 3, axis=-1)
        else:
            q_z, q_r = tf.split(tf.matmul(h, u[:, :2 * units]) + recurrent_bias[:2 * units], 2,
                                axis=-1)
        z, r = tf.sigmoid(x_z + q_z), tf.sigmoid(x_r + q_r)
        if reset_after:
            candidate = tf.tanh(x_h + r * q_h)
        else:
            candidate = tf.tanh(x_h + tf.matmul(r * h, u[:, 2 * units:])
                                + recurrent_bias[2 * units:])
        h = z * h + (1 - z) * candidate
        hs.append(h)
        rs.append(r)
    return tf.stack(hs, 1), tf.stack(rs, 1)


def _values_and_grads(loop, inputs, weights):
    """(h, c, ∂L/∂(a, u, h0, c0)) for L = Σ w_h·h + Σ w_c·c (every output's gradient used)."""
    inputs = [tf.constant(v) for v in inputs]
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        h, c = loop(*inputs)
        loss = tf.reduce_sum(weights[0] * h) + tf.reduce_sum(weights[1] * c)
    return h, c, tape.gradient(loss, inputs, unconnected_gradients="zero")


def _assert_same_values_and_grads(native_loop, tf_loop, inputs, weights, names):
    """The op's outputs and input gradients equal the TF loop's (names: outputs, inputs)."""
    got = _values_and_grads(native_loop, inputs, weights)
    want = _values_and_grads(tf_loop, inputs, weights)
    for name, g, w in zip(names[:2], got[:2], want[:2]):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-5, atol=2e-6, err_msg=name)
    for name, g, w in zip(names[2:], got[2], want[2]):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=2e-5, atol=2e-5,
                                   err_msg=f"gradient of {name}")


SIZES = [(3, 5, 4), (17, 1, 3), (33, 7, 8), (1, 2, 1)]  # (batch, steps, units)


@needs_op
@pytest.mark.parametrize("batch, steps, units", SIZES)
def test_lstm_equals_tf_ops_forward_and_backward(batch, steps, units):
    rng = np.random.default_rng(batch * 100 + steps)
    a = rng.standard_normal((batch, steps, 4 * units)).astype("float32")
    u = (rng.standard_normal((units, 4 * units)) / np.sqrt(units)).astype("float32")
    h0, c0 = (rng.standard_normal((batch, units)).astype("float32") for _ in range(2))
    weights = [rng.standard_normal((batch, steps, units)).astype("float32") for _ in range(2)]
    _assert_same_values_and_grads(native.lstm_sequence, _tf_loop, [a, u, h0, c0], weights,
                                  ("h", "c", "a", "u", "h0", "c0"))


@needs_op
@pytest.mark.parametrize("reset_after", [True, False])
@pytest.mark.parametrize("batch, steps, units", SIZES)
def test_gru_equals_tf_ops_forward_and_backward(batch, steps, units, reset_after):
    rng = np.random.default_rng(batch * 100 + steps)
    a = rng.standard_normal((batch, steps, 3 * units)).astype("float32")
    u = (rng.standard_normal((units, 3 * units)) / np.sqrt(units)).astype("float32")
    bias = rng.standard_normal(3 * units).astype("float32")
    h0 = rng.standard_normal((batch, units)).astype("float32")
    weight = rng.standard_normal((batch, steps, units)).astype("float32")
    # The reset gates are values (the recurrent kernel's rows), not differentiated.
    tf_gru = lambda *args: (_tf_gru_loop(*args, reset_after)[0],
                            tf.stop_gradient(_tf_gru_loop(*args, reset_after)[1]))
    native_gru = functools.partial(native.gru_sequence, reset_after=reset_after)
    _assert_same_values_and_grads(native_gru, tf_gru, [a, u, bias, h0], [weight, 0.0],
                                  ("h", "reset gates", "a", "u", "recurrent_bias", "h0"))


@needs_op
def test_gru_reset_gates_carry_no_gradient():
    """They are values (the recurrent kernel's rows): stopped, as the TF loop's extras are not
    differentiated either."""
    a = tf.ones([2, 3, 6])
    with tf.GradientTape() as tape:
        tape.watch(a)
        _, reset = native.gru_sequence(a, tf.ones([2, 6]), tf.zeros([6]), tf.zeros([2, 2]))
        loss = tf.reduce_sum(reset)
    assert tape.gradient(loss, a) is None


@needs_op
def test_unused_outputs_and_unknown_sizes():
    """Only h used (c's gradient None); traced with unknown batch and steps."""
    rng = np.random.default_rng(0)
    a = tf.constant(rng.standard_normal((4, 3, 8)), tf.float32)
    u = tf.constant(rng.standard_normal((2, 8)), tf.float32)
    zeros = tf.zeros([4, 2])

    @tf.function(input_signature=[tf.TensorSpec([None, None, 8])])
    def last_h_grad(a):
        with tf.GradientTape() as tape:
            tape.watch(a)
            h, _ = native.lstm_sequence(a, u, tf.zeros([tf.shape(a)[0], 2]),
                                        tf.zeros([tf.shape(a)[0], 2]))
            loss = tf.reduce_sum(h[:, -1])
        return h, tape.gradient(loss, a)

    h, grad = last_h_grad(a)
    with tf.GradientTape() as tape:
        tape.watch(a)
        want_h, _ = _tf_loop(a, u, zeros, zeros)
        loss = tf.reduce_sum(want_h[:, -1])
    np.testing.assert_allclose(h.numpy(), want_h.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad.numpy(), tape.gradient(loss, a).numpy(), rtol=1e-5,
                               atol=1e-6)


@needs_op
def test_refuses_mismatched_shapes():
    with pytest.raises(tf.errors.InvalidArgumentError, match="shapes do not match"):
        native.lstm_sequence(tf.ones([2, 3, 8]), tf.ones([2, 6]), tf.ones([2, 2]),
                             tf.ones([2, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="shapes do not match"):
        native.gru_sequence(tf.ones([2, 3, 6]), tf.ones([2, 8]), tf.zeros([6]), tf.ones([2, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="recurrent_bias must be"):
        native.gru_sequence(tf.ones([2, 3, 6]), tf.ones([2, 6]), tf.zeros([5]), tf.ones([2, 2]))


def _update(monkeypatch, layer_fn, *, options=None, jit_compile=False, mask_zero=False):
    """(weight changes of one DP step, native calls) of Embedding + layer_fn() + Dense."""
    calls = record_calls(monkeypatch, "lstm_sequence")
    record_calls(monkeypatch, "gru_sequence", calls=calls)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input([6], dtype="int32"),
                              keras.layers.Embedding(20, 5, mask_zero=mask_zero), layer_fn(),
                              keras.layers.Dense(3)])
    with warnings.catch_warnings():  # noise_multiplier=0: exact updates to compare
        warnings.simplefilter("ignore")
        model = make_private(model, l2_norm_clip=0.01, noise_multiplier=0.0, options=options)
    model.compile(optimizer=keras.optimizers.SGD(1.0), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    x = np.random.default_rng(1).integers(1, 20, (16, 6)).astype("int32")
    x[:4, 4:] = 0  # padding, masked with mask_zero
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, np.arange(16) % 3, batch_size=16, shuffle=False, verbose=0)
    return [w - b for w, b in zip(model.get_weights(), before)], calls


LAYERS = {
    "lstm": lambda: keras.layers.LSTM(4),
    "sequences_and_states": lambda: _LastOf(keras.layers.LSTM(4, return_sequences=True,
                                                              return_state=True)),
    "go_backwards": lambda: keras.layers.LSTM(4, go_backwards=True),
    "rnn_lstm_cell": lambda: keras.layers.RNN(keras.layers.LSTMCell(4)),
    "gru": lambda: keras.layers.GRU(4),
    "gru_sequences_and_state": lambda: _LastOf(keras.layers.GRU(4, return_sequences=True,
                                                                return_state=True)),
    "gru_go_backwards_no_bias": lambda: keras.layers.GRU(4, go_backwards=True, use_bias=False),
    "rnn_gru_cell": lambda: keras.layers.RNN(keras.layers.GRUCell(4)),
    "gru_reset_before": lambda: keras.layers.GRU(4, reset_after=False),
    "gru_reset_before_sequences_and_state": lambda: _LastOf(keras.layers.GRU(
        4, reset_after=False, return_sequences=True, return_state=True)),
    "gru_reset_before_go_backwards_no_bias": lambda: keras.layers.GRU(
        4, reset_after=False, go_backwards=True, use_bias=False),
}


class _LastOf(keras.layers.Layer):
    """The sequence's mean plus both final states: every output of the LSTM in the loss."""

    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x):
        sequence, h, *c = self.inner(x)  # an LSTM's c, a GRU's nothing
        return tf.reduce_mean(sequence, 1) + h + 2 * sum(c)


@needs_op
@pytest.mark.parametrize("kind", list(LAYERS))
def test_the_engine_takes_the_op_with_tf_loops_update(monkeypatch, kind):
    """Binding clipping (C = 0.01): the norms decide every update; the op's and TF's agree."""
    native.load()
    with_op, calls = _update(monkeypatch, LAYERS[kind])
    assert calls, "the recurrent layer's time loop did not take the native op"
    without, calls_off = _update(monkeypatch, LAYERS[kind],
                                      options=EngineOptions(native=False))
    assert not calls_off
    for a, b in zip(with_op, without):
        assert np.count_nonzero(a)
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-8)


@needs_op
@pytest.mark.parametrize("case", ["mask", "relu", "hard_sigmoid", "xla", "gru_relu",
                                  "gru_mask"])
def test_other_recurrent_layers_keep_tfs_loop(monkeypatch, case):
    """Masks, other activations and XLA-compiled steps keep TF's while loop (still exact)."""
    native.load()
    layer_fn = {"relu": lambda: keras.layers.LSTM(4, activation="relu"),
                "hard_sigmoid": lambda: keras.layers.LSTM(4, recurrent_activation="hard_sigmoid"),
                "gru_relu": lambda: keras.layers.GRU(4, reset_after=False, activation="relu"),
                "gru_mask": lambda: keras.layers.GRU(4),
                }.get(case, lambda: keras.layers.LSTM(4))
    update, calls = _update(monkeypatch, layer_fn, mask_zero=case in ("mask", "gru_mask"),
                                 jit_compile=case == "xla")
    assert not calls
    assert all(np.isfinite(w).all() for w in update)
