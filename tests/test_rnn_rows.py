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
"""tf_tempered.privacy.layer_grads.rnn_rows: SimpleRNN/LSTM/GRU as rows over time steps.

The conformance test (test_conformance_recurrent.py, cases rnn_rows*) checks the
update against per-example tapes; here: the handler's own forward pass computes what
the layer computes (every option it takes), it is the one that records the call, and
the configurations it declines go to the recurrent unit's path (rnn.py).
"""

import numpy as np
import pytest

from conformance_harness import recorded_call
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import layer_grads
from tf_tempered.privacy.errors import UnsupportedLayerError

B, T, D = 4, 6, 3


def _inputs(seed=0):
    return np.random.default_rng(seed).normal(size=(B, T, D)).astype("float32")


def _mask():
    lengths = np.array([6, 4, 1, 3])
    return np.arange(T)[None, :] < lengths[:, None]


LAYERS = {
    "simple_rnn": lambda **kw: keras.layers.SimpleRNN(5, **kw),
    "simple_rnn_relu": lambda **kw: keras.layers.SimpleRNN(5, activation="relu", **kw),
    "lstm": lambda **kw: keras.layers.LSTM(5, **kw),
    "lstm_no_bias": lambda **kw: keras.layers.LSTM(5, use_bias=False, **kw),
    "gru": lambda **kw: keras.layers.GRU(5, **kw),
    "gru_sigmoid": lambda **kw: keras.layers.GRU(5, activation="sigmoid", **kw),
}
OPTIONS = {
    "last": {},
    "sequences": {"return_sequences": True},
    "backwards_state": {"go_backwards": True, "return_state": True},
    "sequences_zero_masked": {"return_sequences": True, "zero_output_for_mask": True},
}


@pytest.mark.parametrize("masked", [False, True], ids=["no-mask", "mask"])
@pytest.mark.parametrize("options", list(OPTIONS))
@pytest.mark.parametrize("kind", list(LAYERS))
def test_own_forward_pass_equals_the_layer(kind, options, masked):
    layer = LAYERS[kind](**OPTIONS[options])
    x = _inputs()
    mask = tf.constant(_mask()) if masked else None
    expected = layer(x, mask=mask, training=True)  # builds it; the layer's own call
    out, records = recorded_call(layer, x, mask=mask, training=True)
    assert [r.handler.name for r in records] == ["rnn_rows"]
    for e, o in zip(tf.nest.flatten(expected), tf.nest.flatten(out)):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    assert type(out) is type(expected)  # a list of [output, *states] on Keras 2
    x_rows, h_prev, *extras = records[0].inputs
    assert x_rows.shape == (B, T, D) and h_prev.shape == (B, T, 5)
    assert len(extras) == (1 if kind.startswith("gru") else 0)
    gates = {"simple": 1, "lstm": 4, "gru": 3}[kind.split("_")[0]]
    assert records[0].output.shape == (B, T, 5 * gates)  # A = X·W + b, every step


def test_initial_state_is_used():
    layer = keras.layers.LSTM(5, return_state=True)
    x = _inputs()
    h0 = tf.constant(np.random.default_rng(1).normal(size=(B, 5)).astype("float32"))
    expected = layer(x, initial_state=[h0, 2 * h0])
    out, records = recorded_call(layer, x, initial_state=[h0, 2 * h0])
    assert records[0].handler.name == "rnn_rows"
    for e, o in zip(expected, out):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)
    # The first step's recorded incoming state is the initial state.
    np.testing.assert_allclose(records[0].inputs[1][:, 0].numpy(), h0.numpy())


@pytest.mark.parametrize("layer,why", [
    (keras.layers.LSTM(3, dropout=0.2), "dropout"),
    (keras.layers.GRU(3, recurrent_dropout=0.1), "recurrent_dropout"),
    (keras.layers.SimpleRNN(3, stateful=True), "stateful"),
], ids=["lstm-dropout", "gru-recurrent-dropout", "stateful"])
def test_declined_configurations_take_the_recurrent_unit_path(layer, why):
    """rnn_rows.py declines them; rnn.py then runs the layer (or refuses, with the fix)."""
    layer.build((B if why == "stateful" else None, T, D))
    if why is None:
        assert layer_grads.lookup(layer)[0].name == "rnn"
        return
    with pytest.raises(UnsupportedLayerError, match=why):
        layer_grads.lookup(layer)


def test_gru_with_reset_before_runs_its_own_math():
    """reset_after=False (the candidate's recurrent part on r_t ⊙ h_{t-1}): rnn_rows runs
    it with the layer's outputs, and records the reset gates for U's candidate block."""
    layer = keras.layers.GRU(5, reset_after=False, return_sequences=True, return_state=True)
    x = _inputs()
    expected = layer(x)
    out, records = recorded_call(layer, x)
    assert records[0].handler.name == "rnn_rows" and len(records[0].inputs) == 3
    for e, o in zip(expected, out):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-5, atol=1e-6)


def test_a_custom_cell_takes_the_recurrent_unit_path():
    class ScaledCell(keras.layers.GRUCell):
        def call(self, inputs, states, training=False):
            return super().call(2.0 * inputs, states, training=training)

    layer = keras.layers.RNN(ScaledCell(3))
    layer.build((None, T, D))
    assert layer_grads.lookup(layer)[0].name == "rnn"


def test_a_cell_with_gate_math_of_its_own_takes_the_recurrent_unit_path():
    # Before: rnn_rows ran the stock LSTM math for it (every update wrong, the forward pass
    # not the model's): the cell overrides only the hook LSTMCell.call computes gates with.
    class CoupledCell(keras.layers.LSTMCell):
        def _compute_carry_and_output_fused(self, z, c_tm1):
            forget = tf.sigmoid(z[1])
            return forget * c_tm1 + (1.0 - forget) * tf.tanh(z[2]), tf.sigmoid(z[3])

    layer = keras.layers.RNN(CoupledCell(3))
    layer.build((None, T, D))
    assert layer_grads.lookup(layer)[0].name == "rnn"


@pytest.mark.skipif(KERAS_MAJOR != 2, reason="tf-keras passes initial states in a list input")
def test_keras2_list_inputs_carry_the_initial_states():
    layer = keras.layers.GRU(5)
    x = _inputs()
    h0 = tf.ones([B, 5])
    expected = layer(x, initial_state=h0)
    out, records = recorded_call(layer, [x, h0])
    assert records[0].handler.name == "rnn_rows"
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
