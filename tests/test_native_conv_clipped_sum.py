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
"""The fused Conv2D norms and clipped sum (privacy/native/cc/conv_clipped_sum.cc) against
per-example tapes, its clip factors against the engine's float32 formula, and a private
fit with it (EngineOptions.fused_clipped_sum) against one without."""

import warnings

import numpy as np
import pytest
from conv_op_cases import CASES, RTOL, case_id, reference, setup

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import (DPKerasSGDOptimizer, EngineOptions, layer_paths, make_private,
                                 native)
from tf_tempered.privacy.layer_grads import conv_grads
from tf_tempered.privacy.native import library

needs_op = pytest.mark.skipif(library._compiler() is None,  # pylint: disable=protected-access
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")


def _fused(layer, x, g, groups, other, clip, bias_grads):
    return native.conv2d_clipped_kernel_sum(
        x, g, groups, other, clip, kernel_size=layer.kernel_size, strides=layer.strides,
        dilations=layer.dilation_rate, pads=conv_grads.padding_before(layer, x),
        bias_grads=bias_grads)


def _expected(layer, x, g, groups, other, clip):
    """(n_m, c_m as the engine's clip_factors computes them, Σ c_m G_m, Σ c_m b_m) in NumPy."""
    kernel = reference(layer, x, g, groups)  # [M, K] float64 sums of per-example tapes
    bias = g.numpy().reshape(groups, -1, g.shape[-1]).sum(axis=1)
    own = (kernel.astype("float64") ** 2).sum(1) + (bias.astype("float64") ** 2).sum(1)
    norm = np.sqrt(other.astype("float32") + own.astype("float32"))
    scale = np.where(np.isfinite(norm), np.float32(clip) / np.maximum(norm, np.float32(clip)), 0)
    keep = scale > 0
    return (own, scale, (scale[keep, None] * kernel[keep]).sum(0),
            (scale[keep, None] * bias[keep]).sum(0))


@needs_op
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_norms_factors_and_clipped_sum_equal_per_example_tapes(case, dtype):
    layer, x, g, groups = setup(case, dtype)
    rng = np.random.default_rng(groups)
    other = rng.uniform(0.0, 30.0, groups).astype("float32")
    clip = 4.0  # some microbatches clipped, some not (checked below)
    own, scale, kernel, bias = _fused(layer, x, g, groups, other, clip, bias_grads=True)
    want_own, want_scale, want_kernel, want_bias = _expected(layer, x, g, groups, other, clip)
    assert own.dtype == dtype and scale.dtype == tf.float32
    assert kernel.shape == layer.kernel.shape and bias.shape == (g.shape[-1],)
    np.testing.assert_allclose(own.numpy(), want_own, rtol=RTOL[dtype])
    np.testing.assert_allclose(scale.numpy(), want_scale, rtol=1e-6)
    for got, want in ((kernel, want_kernel), (bias, want_bias)):
        np.testing.assert_allclose(tf.reshape(got, [-1]).numpy(), want.reshape(-1), rtol=0,
                                   atol=RTOL[dtype] * np.abs(want).max())
    if case[-1] > 1:
        assert scale.numpy().min() < 1.0


@needs_op
def test_clip_factors_are_the_engines_bit_for_bit_and_nonfinite_groups_are_skipped():
    layer, x, g, groups = setup(("same", 4, 2, 1, (7, 7), 16, 32, 6, 3), "float32")
    other = np.array([3.0, np.inf, 0.5], "float32")
    own, scale, kernel, bias = _fused(layer, x, g, groups, other, 2.5, bias_grads=False)
    norm = tf.sqrt(other + own)  # as step.clip_factors: float32 sum, root, quotient
    engine = tf.where(tf.math.is_finite(norm), 2.5 / tf.maximum(norm, 2.5), 0.0)
    assert bias is None and scale.numpy()[1] == 0.0
    np.testing.assert_array_equal(scale.numpy(), engine.numpy())
    grads = reference(layer, x, g, groups)
    want = scale.numpy()[0] * grads[0] + scale.numpy()[2] * grads[2]  # no inf·0 = NaN
    np.testing.assert_allclose(tf.reshape(kernel, [-1]).numpy(), want, rtol=0,
                               atol=1e-5 * np.abs(want).max())
    # A non-finite gradient of the layer's own: its microbatch skipped as well.
    x_bad = tf.tensor_scatter_nd_update(x, [[0, 1, 1, 0]], [np.nan])
    own, scale, kernel, _ = _fused(layer, x_bad, g, groups, np.zeros(3, "float32"), 2.5, False)
    assert np.isnan(own.numpy()[0]) and scale.numpy()[0] == 0.0
    assert np.all(np.isfinite(kernel.numpy()))


@needs_op
def test_empty_batch_and_wrong_inputs():
    layer, x, g, _ = setup(("valid", 3, 1, 1, (7, 6), 1, 5, 6, 6), "float32")
    own, scale, kernel, _ = _fused(layer, x[:0], g[:0], 0, np.zeros(0, "float32"), 1.0, False)
    assert own.shape == (0,) and scale.shape == (0,)
    np.testing.assert_array_equal(kernel.numpy(), np.zeros(layer.kernel.shape))
    with pytest.raises(tf.errors.InvalidArgumentError, match="other_sq_norms must be"):
        _fused(layer, x, g, 3, np.zeros(2, "float32"), 1.0, False)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a multiple of num_groups"):
        _fused(layer, x, g, 4, np.zeros(4, "float32"), 1.0, False)


def _cnn(dtype):
    # MNIST's CNN, narrower: conv1 keeps its gradients (196 rows), conv2 is fused.
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(8, 8, strides=2, padding="same", activation="tanh", dtype=dtype),
        keras.layers.MaxPool2D(2, 1, dtype=dtype),
        keras.layers.Conv2D(16, 4, strides=2, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(10, dtype="float32"),
    ])


def _fit_update(fused, dtype, sample_weight):
    rng = np.random.default_rng(3)
    x = rng.normal(size=(32, 28, 28, 1)).astype("float32")
    y, w = rng.integers(0, 10, 32), rng.uniform(0.0, 2.0, 32).astype("float32")
    keras.utils.set_random_seed(0)
    model = make_private(_cnn(dtype), options=EngineOptions(fused_clipped_sum=fused))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.5, noise_multiplier=0.0,
                                                learning_rate=1.0),
                  loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    data = (x, y, w) if sample_weight else (x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # noise 0 (not private) and a pipeline of our own
        model.fit(tf.data.Dataset.from_tensor_slices(data).batch(16), verbose=0)
    return [b - a for a, b in zip(before, model.get_weights())], layer_paths(model)


@needs_op
@pytest.mark.parametrize("dtype,sample_weight", [("float32", False), ("float32", True),
                                                  ("mixed_float16", False)])
def test_a_private_fit_fuses_conv2_and_updates_as_without(dtype, sample_weight):
    fused, paths = _fit_update(True, dtype, sample_weight)
    separate, separate_paths = _fit_update(False, dtype, sample_weight)
    assert [p["path"].startswith("FusedPath(of=ConvPath(native=True") for p in paths] == [
        False, True, False]
    assert not any(p["path"].startswith("FusedPath") for p in separate_paths)
    scale = max(np.abs(s).max() for s in separate)
    assert scale > 0
    for got, want in zip(fused, separate):
        np.testing.assert_allclose(got, want, rtol=0, atol=(1e-5 if dtype == "float32"
                                                           else 1e-3) * scale)
