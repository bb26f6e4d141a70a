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
"""tf_tempered.privacy.layer_grads.conv_lstm: ConvLSTM1D/2D/3D as convolutions per time step.

The conformance test (test_conformance_recurrent.py, cases conv_lstm and rnn_states) checks
the update against per-microbatch tapes; here: the handler's own forward pass computes what
the layer computes (every option it takes), it is the one that records the call, a sequence
length unknown while tracing, and the configurations it declines go to the recurrent unit's
path (rnn.py).
"""

import numpy as np
import pytest

from conformance_harness import recorded_call
from dp_reference import LOSS, _reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import DPGradients, layer_grads, layer_paths
from tf_tempered.privacy.errors import UnsupportedLayerError

B, T = 4, 3


LAYERS = {  # (layer, input shape per step, recorded H_prev shape per step)
    "2d_strided_sequences": (lambda: keras.layers.ConvLSTM2D(
        3, 3, strides=2, padding="same", return_sequences=True), (7, 6, 2), (4, 3, 3)),
    "2d_dilated_backwards_state": (lambda: keras.layers.ConvLSTM2D(
        3, 2, dilation_rate=2, padding="same", go_backwards=True, return_sequences=True,
        return_state=True), (7, 6, 2), (7, 6, 3)),
    "2d_relu_no_bias_backwards": (lambda: keras.layers.ConvLSTM2D(
        2, (3, 2), use_bias=False, activation="relu", go_backwards=True), (7, 6, 2), (5, 5, 2)),
    "1d_state": (lambda: keras.layers.ConvLSTM1D(2, 2, return_state=True), (5, 2), (4, 2)),
    "1d_strided": (lambda: keras.layers.ConvLSTM1D(
        2, 3, strides=2, padding="same", return_sequences=True), (9, 2), (5, 2)),
    "3d_sequences": (lambda: keras.layers.ConvLSTM3D(
        2, 2, padding="same", return_sequences=True), (3, 3, 2, 1), (3, 3, 2, 2)),
    "3d_strided": (lambda: keras.layers.ConvLSTM3D(1, (1, 2, 2), strides=(1, 2, 1)),
                   (3, 4, 3, 2), (3, 2, 2, 1)),
}


@pytest.mark.parametrize("kind", list(LAYERS))
def test_own_forward_pass_equals_the_layer(kind):
    make, step_shape, state_shape = LAYERS[kind]
    layer = make()
    x = np.random.default_rng(0).normal(size=(B, T) + step_shape).astype("float32")
    expected = layer(x, training=True)  # builds it; the layer's own call
    out, records = recorded_call(layer, x, training=True)
    assert [r.handler.name for r in records] == ["conv_lstm"]
    for e, o in zip(tf.nest.flatten(expected), tf.nest.flatten(out)):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    assert type(out) is type(expected)  # a list of [output, *states] on Keras 2
    x_steps, h_prev = records[0].inputs
    assert x_steps.shape == x.shape and h_prev.shape == (B, T) + state_shape
    # A = conv(X, W) + b, every step: the four gates' pre-activations.
    assert records[0].output.shape == (B, T) + state_shape[:-1] + (4 * state_shape[-1],)


def test_initial_state_is_used():
    layer = keras.layers.ConvLSTM2D(3, 3, padding="same", return_state=True)
    x = np.random.default_rng(0).normal(size=(B, T, 5, 5, 2)).astype("float32")
    h0 = tf.constant(np.random.default_rng(1).normal(size=(B, 5, 5, 3)).astype("float32"))
    expected = layer(x, initial_state=[h0, 2 * h0])
    out, records = recorded_call(layer, x, initial_state=[h0, 2 * h0])
    assert records[0].handler.name == "conv_lstm"
    for e, o in zip(expected, out):
        np.testing.assert_allclose(o.numpy(), e.numpy(), rtol=1e-5, atol=1e-5)
    # The first step's recorded incoming state is the initial state.
    np.testing.assert_allclose(records[0].inputs[1][:, 0].numpy(), h0.numpy())


@pytest.mark.skipif(KERAS_MAJOR != 2, reason="tf-keras passes initial states in a list input")
def test_keras2_list_inputs_carry_the_initial_states():
    layer = keras.layers.ConvLSTM1D(2, 3, padding="same")
    x = np.random.default_rng(0).normal(size=(B, T, 6, 2)).astype("float32")
    h0 = tf.ones([B, 6, 2])
    expected = layer(x, initial_state=[h0, h0])
    out, records = recorded_call(layer, [x, h0, h0])
    assert records[0].handler.name == "conv_lstm"
    np.testing.assert_allclose(out.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("layer,why", [
    (lambda: keras.layers.ConvLSTM2D(2, 2, dropout=0.2), "dropout"),
    (lambda: keras.layers.ConvLSTM1D(2, 2, recurrent_dropout=0.1), "recurrent_dropout"),
    (lambda: keras.layers.ConvLSTM2D(2, 2, stateful=True), "stateful"),
], ids=["dropout", "recurrent-dropout", "stateful"])
def test_declined_configurations_take_the_recurrent_unit_path(layer, why):
    """conv_lstm.py declines them; rnn.py then refuses them, with the fix."""
    layer = layer()
    layer.build((B, T, 5, 5, 2) if isinstance(layer, keras.layers.ConvLSTM2D) else (B, T, 5, 2))
    with pytest.raises(UnsupportedLayerError, match=why):
        layer_grads.lookup(layer)


def test_a_replaced_cell_takes_the_recurrent_unit_path():
    layer = keras.layers.ConvLSTM2D(2, 2)
    layer.build((None, T, 5, 5, 2))
    assert layer_grads.lookup(layer)[0].name == "conv_lstm"
    cell = layer.cell
    scaled = type("ScaledConvLSTMCell", (type(cell),), {
        "call": lambda self, inputs, states, training=False: type(cell).call(
            self, 2.0 * inputs, states, training=training)})
    object.__setattr__(cell, "__class__", scaled)
    assert layer_grads.lookup(layer)[0].name == "rnn"


def test_a_call_with_a_mask_takes_the_recurrent_unit_path():
    layer = keras.layers.ConvLSTM1D(2, 2)
    x = np.random.default_rng(0).normal(size=(B, T, 5, 2)).astype("float32")
    layer(x)
    _, records = recorded_call(layer, x, mask=tf.ones([B, T], tf.bool))
    assert [r.handler.name for r in records] == ["rnn"]


def _unknown_length_model(dtype):
    return keras.Sequential([
        keras.Input((None, 5, 4, 2), dtype=dtype),
        keras.layers.ConvLSTM2D(3, 3, padding="same", return_sequences=True, dtype=dtype),
        keras.layers.ConvLSTM2D(2, 2, strides=2, go_backwards=True, dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def test_sequence_length_unknown_while_tracing_matches_per_example_tapes():
    """The time loop and the convolutions' rows with T unknown: DP-SGD's gradient (clip at
    the median per-example norm) equals the float64 per-example reference."""
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(8, 4, 5, 4, 2)), rng.integers(0, 3, 8)
    keras.utils.set_random_seed(0)
    model = _unknown_length_model("float32")
    norms, update = _reference(_unknown_length_model, model.get_weights(), x, y, len(x))
    clip = float(np.median(norms))
    dp = DPGradients(model, LOSS, l2_norm_clip=clip, noise_multiplier=0.0)
    step = tf.function(lambda xs, ys: dp(xs, ys)[0], input_signature=[
        tf.TensorSpec([None, None, 5, 4, 2], tf.float32), tf.TensorSpec([None], tf.int64)])
    ours = step(tf.constant(x, tf.float32), tf.constant(y))
    reference = update(clip)  # -Σ_i clip_C(g_i) / n: the step of learning rate 1
    scale = max(np.abs(r).max() for r in reference)
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o.numpy(), -r, rtol=0, atol=1e-5 * scale)
    assert {p["class"]: p["handler"] for p in layer_paths(model)} == {
        "ConvLSTM2D": "conv_lstm", "Dense": "dense"}
