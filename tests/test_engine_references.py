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
"""The fast DP engine against per-microbatch GradientTape references (float64).

TF Privacy's own optimizer is not a reference everywhere (it is wrong for
Conv2D(groups=2)), so here the reference is DP-SGD written out: one float64 tape
per microbatch, the global norm, TF Privacy's clip factor min(1, C/‖g_m‖), the
sum over microbatches divided by their number. The clip norm is the median of
the reference norms, so some microbatches are clipped and some are not.
"""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer
from tf_tempered.privacy import UnsupportedLayerError, clipping, make_private, native, strategy

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
BATCH = 16


def _microbatch_grads(model, x, y, num_microbatches):
    """Each microbatch's gradient (of its mean loss) as float64 arrays, by tape."""
    grads = []
    for xs, ys in zip(np.split(x, num_microbatches), np.split(y, num_microbatches)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(LOSS(ys, model(xs, training=True)))
        g = tape.gradient(loss, model.trainable_variables,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads.append([t.numpy().astype(np.float64) for t in g])
    return grads


def _reference(builder, weights, x, y, num_microbatches):
    """(microbatch norms, function clip → DP-SGD update with lr 1) in float64."""
    model = builder("float64")
    model.set_weights([w.astype(np.float64) for w in weights])
    grads = _microbatch_grads(model, x.astype(np.float64), y, num_microbatches)
    norms = np.array([np.sqrt(sum(np.sum(t ** 2) for t in g)) for g in grads])

    def update(clip):
        factors = np.minimum(1.0, clip / norms)
        return [-sum(f * g[i] for f, g in zip(factors, grads)) / num_microbatches
                for i in range(len(grads[0]))]

    return norms, update


def _engine_update(builder, weights, x, y, clip, num_microbatches, static_batch, dtype):
    model = builder(dtype)
    model.set_weights([w.astype(dtype) for w in weights])
    make_private(model)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0,
                                                num_microbatches=num_microbatches,
                                                learning_rate=1.0), loss=LOSS)
    before = [v.numpy() for v in model.trainable_variables]
    # Without drop_remainder the traced step does not know the batch size. (fit on
    # arrays whose size is a multiple of batch_size traces a static batch size.)
    data = tf.data.Dataset.from_tensor_slices((x.astype(dtype), y)).batch(
        len(x), drop_remainder=static_batch)
    history = model.fit(data, verbose=0).history
    assert model.train_function is not None
    after = [v.numpy() for v in model.trainable_variables]
    return [a - b for a, b in zip(after, before)], history


def assert_engine_matches_reference(builder, x, y, *, num_microbatches=None, static_batch=False,
                                    dtype="float32"):
    """The engine's update (noise 0) equals the float64 reference, clip at the median norm."""
    weights = builder("float32").get_weights()
    microbatches = num_microbatches or len(x)
    norms, reference_update = _reference(builder, weights, x, y, microbatches)
    clip = float(np.median(norms))
    clipped = np.mean(norms > clip)
    assert 0 < clipped < 1, norms  # a mix of clipped and unclipped microbatches
    reference = reference_update(clip)
    ours, history = _engine_update(builder, weights, x, y, clip, num_microbatches,
                                   static_batch, dtype)
    np.testing.assert_allclose(history["dp_clipped_fraction"][0], clipped)
    np.testing.assert_allclose(history["dp_grad_norm"][0], norms.mean(), rtol=1e-4)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    atol = (1e-5 if dtype == "float32" else 1e-6) * scale  # float64: the clip factors are float32
    for r, o in zip(reference, ours):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=0, atol=atol)
    return norms


# --- Dilated Conv2D ---------------------------------------------------------

def _dilated_cnn(dtype):
    # cin·cout = 6: the depthwise candidate; the second layer has an asymmetric dilation.
    return keras.Sequential([
        keras.Input((10, 9, 2), dtype=dtype),
        keras.layers.Conv2D(3, 3, dilation_rate=2, padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.Conv2D(5, (3, 2), dilation_rate=(2, 1), padding="valid",
                            activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _seeded(builder, seed=0):
    def build(dtype):
        keras.utils.set_random_seed(seed)
        return builder(dtype)

    build.__name__ = builder.__name__
    return build


def _images(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH,) + shape), rng.integers(0, 3, BATCH)


_DILATED_PATHS = {
    # TF ops (no compiler, TF_TEMPERED_NATIVE=0, or a GPU): the rules' own choice
    # (which took the depthwise path for the first layer), and each strategy forced.
    "tf-auto": {"_USE_NATIVE": False},
    "tf-ghost": {"_USE_NATIVE": False, "_FORCED_STRATEGY": "ghost"},
    "tf-materialize": {"_USE_NATIVE": False, "_FORCED_STRATEGY": "materialize"},
    # The native op, with per-microbatch gradients and with norms only (the
    # book-keeping clipped sum, which used TF's backprop-filter op).
    "native-auto": {},
    "native-materialized": {"_FORCED_STRATEGY": "native", "_NATIVE_MATERIALIZE_MIN_ROWS": 0},
    "native-norms-only": {"_FORCED_STRATEGY": "native", "_MATERIALIZE_MAX_BYTES": 0},
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("path", list(_DILATED_PATHS))
def test_dilated_conv2d_equals_per_example_reference(monkeypatch, path, static_batch, dtype):
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    for name, value in _DILATED_PATHS[path].items():
        monkeypatch.setattr(strategy, name, value)
    x, y = _images((10, 9, 2))
    assert_engine_matches_reference(_seeded(_dilated_cnn), x, y, static_batch=static_batch,
                                    dtype=dtype)


@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "native-norms-only"])
def test_dilated_conv2d_with_microbatches_equals_reference(monkeypatch, path):
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    for name, value in _DILATED_PATHS[path].items():
        monkeypatch.setattr(strategy, name, value)
    x, y = _images((10, 9, 2), seed=1)
    assert_engine_matches_reference(_seeded(_dilated_cnn), x, y, num_microbatches=4,
                                    static_batch=True, dtype="float64")


# --- Rows per example: microbatches, sequences, TimeDistributed ----------------

def _mlp(dtype):
    return keras.Sequential([
        keras.Input((6,), dtype=dtype),
        keras.layers.Dense(5, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _time_distributed_dense(dtype):
    # The inner Dense sees [B·T, d] rows (reshape-based TimeDistributed) or one
    # time step at a time (rnn-based, static batch); Dense(1): one bias per row.
    return keras.Sequential([
        keras.Input((4, 6), dtype=dtype),
        keras.layers.TimeDistributed(keras.layers.Dense(5, activation="tanh", dtype=dtype),
                                     dtype=dtype),
        keras.layers.TimeDistributed(keras.layers.Dense(1, dtype=dtype), dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _time_distributed_generic(dtype):
    # Layers on the generic (per-row VJP) path under TimeDistributed.
    from tf_tempered.layers import TemperedSigmoid  # pylint: disable=g-import-not-at-top
    return keras.Sequential([
        keras.Input((4, 6), dtype=dtype),
        keras.layers.Dense(5, dtype=dtype),
        keras.layers.TimeDistributed(keras.layers.LayerNormalization(dtype=dtype), dtype=dtype),
        keras.layers.TimeDistributed(TemperedSigmoid(learnable=True, dtype=dtype), dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


def _vectors(shape, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH,) + shape), rng.integers(0, 3, BATCH)


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("forced", [None, "ghost", "materialize"])
def test_dense_microbatches_equal_reference(monkeypatch, forced, num_microbatches, static_batch):
    monkeypatch.setattr(strategy, "_FORCED_STRATEGY", forced)
    x, y = _vectors((6,))
    assert_engine_matches_reference(_seeded(_mlp), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch)


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("builder", [_time_distributed_dense, _time_distributed_generic],
                         ids=["dense", "generic"])
def test_time_distributed_equals_reference(builder, num_microbatches, static_batch):
    x, y = _vectors((4, 6))
    if builder is _time_distributed_generic and static_batch:
        # With a static batch size tf-keras' TimeDistributed loops over time steps
        # for a custom layer (TemperedSigmoid), calling it more than once.
        with pytest.raises(UnsupportedLayerError,
                           match="'tempered_sigmoid.*' is called once per time step by "
                                 "TimeDistributed layer .*without TimeDistributed"):
            assert_engine_matches_reference(_seeded(builder), x, y,
                                            num_microbatches=num_microbatches, static_batch=True)
        return
    assert_engine_matches_reference(_seeded(builder), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch)


def _time_distributed_cnn(dtype):
    # Each Conv2D sees [B·T, H, W, C]: T = 3 images per example.
    return keras.Sequential([
        keras.Input((3, 7, 6, 2), dtype=dtype),
        keras.layers.TimeDistributed(keras.layers.Conv2D(3, 3, padding="same", activation="tanh",
                                                         dtype=dtype), dtype=dtype),
        keras.layers.TimeDistributed(keras.layers.Conv2D(12, 3, strides=2, activation="tanh",
                                                         dtype=dtype), dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "tf-chunks",
                                  "native-auto", "native-norms-only"])
def test_time_distributed_conv2d_equals_reference(monkeypatch, path, num_microbatches,
                                                  static_batch):
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    if path == "tf-chunks":  # patches made in chunks of one microbatch
        monkeypatch.setattr(clipping, "_PATCH_CHUNK_BYTES", 1)
        monkeypatch.setattr(strategy, "_USE_NATIVE", False)
        monkeypatch.setattr(strategy, "_DEPTHWISE_MAX_CHANNEL_PAIRS", 0)
    else:
        for name, value in _DILATED_PATHS[path].items():
            monkeypatch.setattr(strategy, name, value)
    x, y = _vectors((3, 7, 6, 2))
    assert_engine_matches_reference(_seeded(_time_distributed_cnn), x, y,
                                    num_microbatches=num_microbatches, static_batch=static_batch)


# --- The paper's kind of CNN, every path, some microbatches clipped ------------

def _cnn_learnable(dtype):
    from tf_tempered.layers import TemperedSigmoid  # pylint: disable=g-import-not-at-top
    return keras.Sequential([
        keras.Input((12, 12, 2), dtype=dtype),
        keras.layers.Conv2D(4, 3, strides=2, padding="same", dtype=dtype),  # depthwise candidate
        TemperedSigmoid(scale=1.5, inverse_temperature=2.0, offset=0.5, learnable=True,
                        dtype=dtype),
        keras.layers.Conv2D(16, 3, padding="valid", activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(8, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "tf-chunks",
                                  "native-auto", "native-materialized", "native-norms-only"])
def test_cnn_with_some_microbatches_clipped_equals_reference(monkeypatch, path, num_microbatches,
                                                             static_batch):
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    if path == "tf-chunks":
        monkeypatch.setattr(clipping, "_PATCH_CHUNK_BYTES", 1)
        monkeypatch.setattr(strategy, "_USE_NATIVE", False)
        monkeypatch.setattr(strategy, "_DEPTHWISE_MAX_CHANNEL_PAIRS", 0)
    else:
        for name, value in _DILATED_PATHS[path].items():
            monkeypatch.setattr(strategy, name, value)
    x, y = _images((12, 12, 2), seed=2)
    assert_engine_matches_reference(_seeded(_cnn_learnable), x, y,
                                    num_microbatches=num_microbatches, static_batch=static_batch)


def _dilated_cnn_any_size(dtype):
    # Unknown height and width: no native op; patches by tf.image.extract_patches.
    return keras.Sequential([
        keras.Input((None, None, 2), dtype=dtype),
        keras.layers.Conv2D(3, 3, dilation_rate=2, padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "native-auto"])
def test_dilated_conv2d_of_unknown_size_equals_reference(monkeypatch, path):
    for name, value in _DILATED_PATHS[path].items():
        monkeypatch.setattr(strategy, name, value)
    x, y = _images((10, 9, 2), seed=3)
    assert_engine_matches_reference(_seeded(_dilated_cnn_any_size), x, y, dtype="float64")
