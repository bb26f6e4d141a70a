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
"""The native per-example depthwise kernel gradients (privacy/native/cc/depthwise_kernel_grads.cc)
against per-example tapes of the layer itself, and the handler's use of them.

The handlers' updates on this path are checked against the float64 per-microbatch reference
by tests/test_conformance_depthwise.py ("auto" takes the native op where it builds)."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import EngineOptions, layer_paths, make_private, native
from tf_tempered.privacy.layer_grads import conv_grads, depthwise
from tf_tempered.privacy.native import library

needs_op = pytest.mark.skipif(library._compiler() is None,  # pylint: disable=protected-access
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")

# (padding, kernel, strides, dilation, (h, w), cin, depth multiplier, batch)
_CASES = [
    ("same", 3, 1, 1, (9, 9), 3, 1, 4),
    ("same", (1, 5), 1, 1, (1, 17), 7, 1, 3),     # a DepthwiseConv1D's 2-D form
    ("same", 3, 2, 1, (8, 7), 4, 2, 2),           # strided, even size, dm 2
    ("valid", (3, 2), 2, 1, (11, 13), 5, 3, 3),   # (TF's float64 kernel: equal strides only)
    ("same", 2, 1, (2, 3), (7, 8), 2, 2, 2),      # dilated (the TF backprop cannot)
    ("valid", 4, 1, 1, (4, 4), 1, 1, 1),          # one output pixel
    ("same", 5, 3, 1, (2, 2), 2, 1, 2),           # kernel larger than the image
]


def _case_id(case):
    padding, kernel, strides, dilation, hw, cin, dm, batch = case
    return f"{padding}-k{kernel}-s{strides}-d{dilation}-{hw}-c{cin}m{dm}-b{batch}"


def _setup(case, dtype, seed=0):
    padding, kernel, strides, dilation, (h, w), cin, dm, batch = case
    layer = keras.layers.DepthwiseConv2D(kernel, strides=strides, padding=padding,
                                         dilation_rate=dilation, depth_multiplier=dm,
                                         dtype=dtype)
    layer.build((None, h, w, cin))
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, h, w, cin)), dtype)
    g = tf.constant(rng.normal(size=layer(x).shape), dtype)
    return layer, x, g


def _reference(layer, x, g):
    """[kh·kw, B, cin·dm] per-example tape gradients of the layer's kernel."""
    per_example = []
    for e in range(x.shape[0]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x[e:e + 1]) * g[e:e + 1])
        kernel_grad = tape.gradient(loss, keras_bridge.depthwise_kernel(layer)).numpy()  # [kh, kw, cin, dm]
        per_example.append(kernel_grad.reshape(-1, kernel_grad.shape[2] * kernel_grad.shape[3]))
    return np.stack(per_example, axis=1)


def _op(layer, x, g):
    pair = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v, v)
    return native.depthwise_kernel_grads(
        x, g, kernel_size=pair(layer.kernel_size), strides=pair(layer.strides),
        dilations=pair(layer.dilation_rate), pads=conv_grads.padding_before(layer, x))


@needs_op
@pytest.mark.parametrize("dtype,rtol", [("float32", 2e-6), ("float64", 1e-13)])
@pytest.mark.parametrize("case", _CASES, ids=_case_id)
def test_equals_per_example_tapes(case, dtype, rtol):
    layer, x, g = _setup(case, dtype)
    got = _op(layer, x, g)
    reference = _reference(layer, x, g)
    assert got.dtype == tf.as_dtype(dtype) and got.shape == reference.shape
    scale = np.abs(reference).max()
    assert scale > 0
    assert np.abs(got.numpy() - reference).max() <= rtol * scale


@needs_op
def test_in_a_function_with_an_unknown_batch():
    layer, x, g = _setup(_CASES[2], "float32")
    spec = lambda t: tf.TensorSpec([None] + t.shape[1:].as_list(), t.dtype)
    # autograph=False: the graph is what is tested; autograph's conversion of _op, late in
    # a long pytest worker, took 40 s (faulthandler: gast's AST visits), 0.3 s alone.
    fn = tf.function(lambda a, b: _op(layer, a, b), input_signature=[spec(x), spec(g)],
                     autograph=False)
    np.testing.assert_array_equal(fn(x, g).numpy(), _op(layer, x, g).numpy())
    assert fn(x[:0], g[:0]).shape == (9, 0, 8)


@needs_op
def test_channels_that_do_not_divide_are_refused():
    x, g = tf.zeros([2, 5, 5, 3]), tf.zeros([2, 5, 5, 4])
    with pytest.raises(tf.errors.InvalidArgumentError, match="not a multiple"):
        native.depthwise_kernel_grads(x, g, kernel_size=(3, 3), strides=(1, 1),
                                      dilations=(1, 1), pads=(1, 1))


def _separable_model():
    return keras.Sequential([
        keras.Input((6, 16, 3)),
        keras.layers.DepthwiseConv2D(3, padding="same", depth_multiplier=2, activation="tanh"),
        keras.layers.SeparableConv2D(4, 3, strides=2, activation="tanh"),
        keras.layers.Flatten(), keras.layers.Dense(3)])


def _update(options):
    keras.utils.set_random_seed(0)
    model = make_private(_separable_model(), l2_norm_clip=0.05, noise_multiplier=0.0,
                         options=options)
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    rng = np.random.default_rng(1)
    with pytest.warns(UserWarning):  # noise_multiplier=0 warns that nothing is private
        model.fit(rng.normal(size=(8, 6, 16, 3)).astype("float32"), np.arange(8) % 3,
                  batch_size=8, shuffle=False, verbose=0)
    paths = [p["path"] for p in layer_paths(model) if p["class"] != "Dense"]
    return [a - b for a, b in zip(model.get_weights(), before)], paths


@needs_op
def test_the_engine_takes_the_op_and_updates_as_the_folded_backprop():
    with_op, paths = _update(EngineOptions())
    assert all("method='native'" in p for p in paths), paths
    folded, paths_off = _update(EngineOptions(native=False))
    assert all("method='folded'" in p for p in paths_off), paths_off
    # Clipping at 0.05 binds: a wrong norm would change the update, not only a wrong gradient.
    for a, b in zip(with_op, folded):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    assert all(np.count_nonzero(a) for a in with_op)


def test_choose_path_without_tensors_keeps_the_tf_ops_rule():
    layer = keras.layers.DepthwiseConv2D(3)
    layer.build((None, 9, 9, 3))
    params = depthwise.depthwise_hyperparameters(layer, keras_bridge.depthwise_kernel(layer), True)
    assert depthwise.choose_path(params, EngineOptions()).method == "folded"
