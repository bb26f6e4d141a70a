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
"""Recording hooks: inputs and pre-activation outputs of trainable layers, only while active."""

import numpy as np
import pytest

from dp_reference import assert_engine_matches_reference, assert_exact_update
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import errors, recording


def _model():
    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="tanh"),
                             keras.layers.Dropout(0.5), keras.layers.Dense(2)])


def test_records_input_and_pre_activation_output_while_active():
    model = _model()
    layers = recording.instrument(model)
    assert [layer.name for layer in layers] == [model.layers[0].name, model.layers[2].name]
    assert recording.instrument(model) == layers  # idempotent: no second wrapper
    x = tf.constant(np.random.default_rng(0).normal(size=(5, 4)), tf.float32)
    recorder = recording.Recorder()
    with recorder.active():
        y = model(x)
    first, second = recorder.records
    assert (first.kind, second.kind) == ("dense", "dense")
    np.testing.assert_allclose(first.inputs.numpy(), x.numpy())
    pre_activation = x @ model.layers[0].kernel + model.layers[0].bias
    np.testing.assert_allclose(first.output.numpy(), pre_activation.numpy(), atol=1e-6)
    np.testing.assert_allclose(second.output.numpy(), y.numpy(), atol=1e-6)
    # The activation is back in place, and nothing is recorded outside `active()`.
    assert model.layers[0].activation is keras.activations.tanh
    model(x)
    assert len(recorder.records) == 2


def test_trainable_batch_normalization_in_training_mode_is_refused_with_the_fix():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    # Instrumented whether trainable or frozen (a frozen one may be unfrozen later); its
    # call is refused while recording in training mode, and allowed in inference mode.
    assert len(recording.instrument(model)) == 2
    x = tf.ones((5, 4))
    with recording.Recorder().active():
        with pytest.raises(errors.UnsupportedLayerError, match="LayerNormalization"):
            model(x, training=True)
    with recording.Recorder().active() as recorder:
        model(x, training=False)
    assert [r.kind for r in recorder.records][0] == "dense" and len(recorder.records) == 2
    model.layers[1].trainable = False
    with recording.Recorder().active() as recorder:
        model(x, training=True)  # frozen: moving statistics, nothing to record
    assert len(recorder.records) == 1


@pytest.mark.skipif(not hasattr(keras.layers, "MixUp"), reason="Keras 3's MixUp and CutMix")
@pytest.mark.parametrize("mixing", ["MixUp", "CutMix"])
def test_a_layer_blending_examples_of_the_batch_is_refused_by_make_private(mixing):
    # Weightless, so never recorded: it trained silently (a MixUp model's clipped sum moved
    # by 2.6 C when one example was replaced, over the 2 C bound).
    from tf_tempered.privacy import make_private  # pylint: disable=g-import-not-at-top
    model = keras.Sequential([keras.Input((8, 8, 3)), getattr(keras.layers, mixing)(),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    with pytest.raises(errors.UnsupportedLayerError,
                       match=rf"\({mixing}\) blends each example with another.*Fix: remove it"):
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)


def test_own_trainable_weights_excludes_frozen_layers():
    layer = keras.layers.Dense(2)
    layer.build((None, 3))
    assert len(recording.own_trainable_weights(layer)) == 2
    layer.trainable = False
    assert recording.own_trainable_weights(layer) == []


class _StepsLoop(keras.layers.Layer):
    """A recurrence written with a Python loop over a tensor, which tf-keras converts with
    AutoGraph in each call of a subclassed layer (Keras 3 converts no layer's call)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 4), name="w")
        self.u = self.add_weight(shape=(4, 4), name="u")

    def call(self, x):
        h = tf.zeros([tf.shape(x)[0], 4], x.dtype)
        for t in tf.range(tf.shape(x)[1]):
            h = tf.tanh(tf.matmul(x[:, t], self.w) + tf.matmul(h, self.u))
        return h


class _RowsLoop(keras.layers.Layer):
    """No weights: each example's row doubled where its sum is positive, by a Python loop
    and ``if`` over tensors (AutoGraph's)."""

    def call(self, h):
        rows = tf.TensorArray(h.dtype, size=tf.shape(h)[0])
        for i in tf.range(tf.shape(h)[0]):
            row = h[i]
            if tf.reduce_sum(row) > 0:
                row = row * 2.0
            rows = rows.write(i, row)
        return tf.reshape(rows.stack(), tf.shape(h))


# Before (tf-keras): OperatorNotAllowedInGraphError ("Iterating over a symbolic tf.Tensor"):
# the recording wrapper called a layer's call unconverted, and the step called the model
# with AutoGraph off (a layer without weights); plain tf-keras trains both.
@pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3 converts no layer's call (plain Keras "
                    "fails the same way)")
@pytest.mark.parametrize("weights", [True, False])
def test_a_layer_call_needing_autograph_trains_with_the_exact_update_on_tf_keras(weights):
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(6, 5, 3)).astype(np.float32), rng.integers(0, 3, 6)

    def build(dtype="float32"):
        middle = [_StepsLoop(dtype=dtype)] if weights else [
            keras.layers.Flatten(dtype=dtype), keras.layers.Dense(4, dtype=dtype),
            _RowsLoop(dtype=dtype)]
        return keras.Sequential([keras.Input((5, 3), dtype=dtype), *middle,
                                 keras.layers.Dense(3, dtype=dtype)])

    assert_exact_update(build, x, y)


_OF_UNKNOWN_WIDTH = {  # layers whose norm paths size rows by the input's width
    "dense": lambda: keras.layers.Dense(4, activation="tanh"),
    "conv1d": lambda: keras.layers.Conv1D(4, 2, activation="tanh"),
    "lstm": lambda: keras.layers.LSTM(3, return_sequences=True),
    "einsum_dense": lambda: keras.layers.EinsumDense("abc,cd->abd", (3, 2), bias_axes="d"),
    # Contracting axis 1, left unknown by the reshape below (probe G3, F4: a TypeError).
    "einsum_dense_middle_axis": lambda: keras.layers.EinsumDense("abc,bd->acd", (4, 2)),
}


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="tf-keras cannot build a layer on a None width")
@pytest.mark.parametrize("kind", list(_OF_UNKNOWN_WIDTH))
def test_an_input_of_unknown_width_while_traced_takes_the_width_the_weights_fix(kind):
    # Before: a reshape to [tf.shape(t)[0], 3, -1] on batches of unknown size left the
    # input's last axis unknown while traced, and the engine failed with a TypeError
    # (None * int) where plain Keras 3 trains (probe F3, 1).
    def build(dtype):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((3, 4), dtype=dtype)
        rows = [-1, 4] if kind.endswith("middle_axis") else [3, -1]
        h = keras.layers.Lambda(lambda t: tf.reshape(t, [tf.shape(t)[0], *rows]),
                                output_shape=(3, 4), dtype=dtype)(inputs)
        h = keras.layers.Flatten()(_OF_UNKNOWN_WIDTH[kind]()(h))
        return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(h))

    rng = np.random.default_rng(0)
    assert_engine_matches_reference(build, rng.normal(size=(16, 3, 4)).astype(np.float32),
                                    rng.integers(0, 3, 16))
