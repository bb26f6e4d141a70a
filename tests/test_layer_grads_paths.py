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
"""The Dense/Conv2D handlers' path choice, on the layer shapes the thresholds were measured on."""

import itertools

import pytest

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import EngineOptions
from tf_tempered.privacy import native
from tf_tempered.privacy import layer_grads
from tf_tempered.privacy.layer_grads import conv, dense, depthwise, rows, rows_path

BATCH = 256


def _record(layer, input_shape, batch=BATCH, **options):
    """(RowSource, hyperparameters) of a layer: the shapes and dtype are all the choice reads."""
    layer.build((None,) + input_shape)
    x = tf.zeros((batch,) + input_shape)
    conv2d = isinstance(layer, keras.layers.Conv2D)
    handler = conv.Conv2DHandler() if conv2d else dense.DenseHandler()
    params = handler.hyperparameters(layer)
    options = EngineOptions(**options)
    if conv2d:
        # pylint: disable-next=protected-access
        return conv._row_source(x, layer(x), params, options), params
    return rows.RowSource(x, layer(x), x.shape[-1], options), params


def _mnist_conv1(**options):
    return _record(keras.layers.Conv2D(16, 8, strides=2, padding="same"), (28, 28, 1), **options)


def _mnist_conv2(**options):
    return _record(keras.layers.Conv2D(32, 4, strides=2, padding="same"), (7, 7, 16), **options)


def _cifar_conv_8x8(**options):
    return _record(keras.layers.Conv2D(128, 3, padding="same"), (8, 8, 64), **options)


def _choice(record, num_microbatches=BATCH, examples_per_microbatch=1):
    """(rows per microbatch, native, depthwise, materialize) of the handler's path."""
    src, params = record
    g_rows = rows.static_rows(src.grad_output, examples_per_microbatch)
    if isinstance(params, conv.Conv2DHyperparameters):
        path = conv.choose_path(src, params, num_microbatches, examples_per_microbatch)
        return g_rows, path.native, path.depthwise, path.materialize
    return g_rows, False, False, rows.choose_materialize(src, num_microbatches,
                                                         examples_per_microbatch)


needs_native = pytest.mark.skipif(not native.available(), reason="native op not buildable here")


@needs_native
def test_native_choices_on_the_mnist_cnn():
    # conv1: 196 output pixels, gradients kept; conv2: 16 pixels, norms only.
    assert _choice(_mnist_conv1()) == (196, True, False, True)
    assert _choice(_mnist_conv2()) == (16, True, False, False)
    # 4 examples per microbatch: conv2 has 64 rows, its 64 gradients are kept.
    assert _choice(_mnist_conv2(), 64, 4) == (64, True, False, True)


@needs_native
def test_wide_conv_with_few_pixels_takes_the_ghost_norm():
    # 64 rows, 576×128 kernel: ghost 2.9 M multiply-adds per example, native 4.7 M.
    assert _choice(_cifar_conv_8x8()) == (64, False, False, False)


def test_dense_rows_take_the_ghost_norm():
    record = _record(keras.layers.Dense(10), (32,))
    assert _choice(record) == (1, False, False, False)


@pytest.mark.parametrize("onednn", [True, False])
def test_tf_ops_only(monkeypatch, onednn):
    # 1×16 channel pairs: the depthwise backprop where TF's kernels are oneDNN's (fast),
    # image patches where they are Eigen's (6× slower there: docs/benchmarks.md).
    monkeypatch.setattr(keras_bridge, "onednn_enabled", lambda: onednn)
    assert _choice(_mnist_conv1(native=False)) == (196, False, onednn, True)
    assert _choice(_mnist_conv1(native=False, depthwise_max_channel_pairs=16)) == (
        196, False, True, True)
    assert _choice(_mnist_conv1(native=False, depthwise_max_channel_pairs=15)) == (
        196, False, False, True)
    # conv2: d_in·d_out = 8192 > 16·288 rows·(d_in + d_out): ghost.
    assert _choice(_mnist_conv2(native=False)) == (16, False, False, False)
    # With a static count of microbatches but no static batch, rows are unbounded: materialize.
    assert _choice(_mnist_conv2(native=False), 8, None)[1:] == (False, False, True)


def test_memory_cap_turns_materializing_off():
    tf_ops = dict(native=False, depthwise_max_channel_pairs=0)
    record = _record(keras.layers.Conv2D(8, 3), (12, 12, 2), **tf_ops)  # 100 rows, 18×8 kernel
    assert _choice(record)[3] is True
    assert _choice(_record(keras.layers.Conv2D(8, 3), (12, 12, 2), **tf_ops,
                           materialize_max_bytes=BATCH * 18 * 8 * 4 - 1))[3] is False


def _cifar_conv(channels_in, filters, size):
    return _record(keras.layers.Conv2D(filters, 3, padding="same"), (size, size, channels_in))


@needs_native
def test_gradients_kept_only_where_smaller_than_the_ghost_norms_inputs():
    # CIFAR-10 CNN conv3 (16×16×32 → 64): 18 432 gradient values per example against
    # 8 192 input + 16 384 output-gradient values: materialized. conv4 (16×16×64 → 64):
    # 36 864 against 16 384 + 16 384: the native norms only (book-keeping sum).
    assert _choice(_cifar_conv(32, 64, 16)) == (256, True, False, True)
    assert _choice(_cifar_conv(64, 64, 16)) == (256, True, False, False)
    # 2 examples per microbatch keep twice the inputs for one microbatch's gradients.
    assert _choice(_cifar_conv(64, 64, 16), BATCH // 2, 2)[3] is True
    # Forced materialization and an unknown microbatch size keep the first rule only.
    src, params = _record(keras.layers.Conv2D(64, 3, padding="same"), (16, 16, 64),
                          norm_path="materialize")
    assert rows.fits(src, BATCH, 1) is True
    assert rows.fits(_cifar_conv(64, 64, 16)[0], 8, None) is True


def test_tf_ops_memory_slack_follows_the_ghost_norms_extra_cost():
    tf_ops = dict(native=False, depthwise_max_channel_pairs=0)
    # CIFAR-10 conv4 (16×16×64 → 64): the ghost norm 256·(576 + 64) = 163 840 multiply-adds
    # per example against 36 864 (4.4×, slack capped at 2); its 36 864 gradient values
    # against 32 768 kept (1.125×): materialized on the TF-ops path, not on the native one.
    conv4 = _record(keras.layers.Conv2D(64, 3, padding="same"), (16, 16, 64), **tf_ops)
    assert _choice(conv4) == (256, False, False, True)
    # 10×10×64 → 64: the ghost norm 1.74× the multiply-adds (slack 1.74), the gradients
    # 36 864 values against 12 800 kept (2.9×): the ghost norm.
    wide = _record(keras.layers.Conv2D(64, 3, padding="same"), (10, 10, 64), **tf_ops)
    assert _choice(wide) == (100, False, False, False)
    assert rows.fits(wide[0], BATCH, 1, slack=2.9) and not rows.fits(wide[0], BATCH, 1, slack=2.8)
    # A slack of 1 (the rule for the native op's paths) keeps conv4's ghost norm.
    assert not rows.fits(conv4[0], BATCH, 1) and rows.fits(conv4[0], BATCH, 1, slack=1.125)


def test_kept_bytes_rule_decides_per_step_with_an_unknown_microbatch_count():
    # 16 384 gradient values per example against 256 kept: 16 MiB for 256 microbatches
    # (above ALWAYS_MATERIALIZE_BYTES), 0.5 MiB for 8.
    src, _ = _record(keras.layers.Dense(128), (128,))
    materialize = rows.fits(src, tf.constant(BATCH), 1)
    assert tf.is_tensor(materialize) and not bool(materialize)
    assert bool(rows.fits(src, tf.constant(BATCH // 32), 32))


def test_unknown_microbatch_count_decides_per_step():
    tf_ops = dict(native=False, depthwise_max_channel_pairs=0)
    record = _record(keras.layers.Conv2D(8, 3), (12, 12, 2), **tf_ops)
    count = tf.constant(BATCH)
    materialize = _choice(record, count)[3]
    assert tf.is_tensor(materialize) and bool(materialize)
    assert not bool(_choice(_record(keras.layers.Conv2D(8, 3), (12, 12, 2), **tf_ops,
                                    materialize_max_bytes=1), count)[3])


@pytest.mark.parametrize("forced,expected", [("ghost", (False, False, False)),
                                             ("materialize", (False, False, True))])
def test_forced_tf_ops_strategies_skip_native_and_depthwise(forced, expected):
    assert _choice(_mnist_conv1(norm_path=forced))[1:] == expected


@needs_native
def test_forced_native():
    assert _choice(_cifar_conv_8x8(norm_path="native"))[1:3] == (True, False)


def test_rows_reexports_the_path_choice():
    for name in rows_path.__all__:
        assert getattr(rows, name) is getattr(rows_path, name) and name in rows.__all__


def test_input_width_and_rows():
    src, _ = _mnist_conv2()
    assert src.d_in == 4 * 4 * 16
    assert rows.static_rows(src.grad_output, 3) == 48
    assert rows.static_rows(tf.zeros((5, 7)), None) == 1


@pytest.mark.parametrize("layer,options,method", [
    (keras.layers.DepthwiseConv2D(3, depth_multiplier=2), {}, "folded"),
    (keras.layers.DepthwiseConv2D(3, strides=2), {"norm_path": "depthwise"}, "folded"),
    # TF's CPU backprop-filter op ignores dilations: patches, whatever the options.
    (keras.layers.DepthwiseConv2D(3, dilation_rate=2), {}, "patches"),
    (keras.layers.DepthwiseConv2D(3), {"norm_path": "materialize"}, "patches"),
])
def test_depthwise_path(layer, options, method):
    layer.build((None, 9, 9, 3))
    handler, params = layer_grads.lookup(layer)
    assert handler.name == "depthwise_conv2d"
    assert params.kernel_shape == (3, 3, 3, layer.depth_multiplier)
    assert depthwise.choose_path(params, EngineOptions(**options)).method == method


@pytest.mark.parametrize("options,dtype,static,method", [
    ({}, "float32", True, "native"),
    ({}, "float64", True, "native"),
    ({"norm_path": "native"}, "float32", True, "native"),
    # TF ops asked for, a path forced, half precision, or sizes unknown while tracing.
    ({"native": False}, "float32", True, "folded"),
    ({"norm_path": "depthwise"}, "float32", True, "folded"),
    ({"norm_path": "materialize"}, "float32", True, "patches"),
    ({}, "float16", True, "folded"),
    ({}, "float32", False, "folded"),
])
def test_depthwise_path_with_the_native_op(options, dtype, static, method):
    if method == "native" and not native.usable():
        pytest.skip("the native ops cannot be built here")
    layer = keras.layers.DepthwiseConv2D(3, depth_multiplier=2)
    layer.build((None, 9, 9, 3))
    _, params = layer_grads.lookup(layer)
    size = 9 if static else None
    chosen = []
    # Chosen while tracing, where an image size may be unknown.
    tf.function(lambda x, g: chosen.append(
        depthwise.choose_path(params, EngineOptions(**options), x, g)) or 0.0
                ).get_concrete_function(tf.TensorSpec([None, size, size, 3], dtype),
                                        tf.TensorSpec([None, size and 7, size and 7, 6], dtype))
    assert chosen[0].method == method


def test_separable_conv2d_takes_its_handler_unless_channels_first():
    layer = keras.layers.SeparableConv2D(4, 3, depth_multiplier=2)
    layer.build((None, 9, 9, 3))
    handler, params = layer_grads.lookup(layer)
    assert handler.name == "separable_conv2d"
    assert (params.depthwise.kernel_shape, params.pointwise_shape) == ((3, 3, 3, 2), (1, 1, 6, 4))
    first = keras.layers.SeparableConv2D(4, 3, data_format="channels_first")
    first.build((None, 3, 9, 9))
    assert layer_grads.lookup(first)[0] is layer_grads.GENERIC


def test_conv2d_transpose_is_a_conv2d_on_swapped_roles():
    layer = keras.layers.Conv2DTranspose(4, (3, 2), strides=2, output_padding=1)
    layer.build((None, 5, 5, 3))
    handler, params = layer_grads.lookup(layer)
    assert handler.name == "conv2d_transpose" and params.use_bias
    # The equivalent Conv2D: input G (4 channels), output gradient X (3 channels), no bias.
    assert (params.conv2d.kernel_shape, params.conv2d.filters, params.conv2d.use_bias) == (
        (3, 2, 4, 3), 3, False)
    # Dilated: the same Conv2D, dilated.
    dilated = keras.layers.Conv2DTranspose(4, 3, dilation_rate=2)
    dilated.build((None, 5, 5, 3))
    handler, params = layer_grads.lookup(dilated)
    assert handler.name == "conv2d_transpose" and params.conv2d.dilation_rate == (2, 2)


def test_layer_paths_report_each_layers_handler_and_path():
    import numpy as np  # pylint: disable=g-import-not-at-top
    from tf_tempered.privacy import (DPKerasSGDOptimizer, layer_paths,  # pylint: disable=g-import-not-at-top
                                     make_private)
    shared, embedding = keras.layers.Dense(3), keras.layers.Embedding(50, 4)
    inputs = keras.Input((5, 4))
    x = embedding(keras.layers.Flatten()(inputs)[:, :3])
    outputs = shared(keras.layers.Flatten()(x)) + shared(keras.layers.Flatten()(inputs)[:, :12])
    model = make_private(keras.Model(inputs, outputs),
                         options=EngineOptions(norm_path="materialize"))
    with pytest.raises(ValueError, match="no traced DP step yet"):
        layer_paths(model)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    x = np.random.default_rng(0).integers(0, 50, (8, 5, 4)).astype("float32")
    model.fit(x, np.zeros(8), batch_size=4, verbose=0)
    # The shared Dense: its two calls of one shape as one call of 2 rows per example
    # (multi_call.rows_of_calls), on the Dense handler's own path.
    # The native norm op where its library is built (a 200-weight table builds nothing).
    sparse = "sparse_native" if native.usable(50 * 4) else "sparse"
    assert layer_paths(model) == [
        {"layer": embedding.name, "class": "Embedding", "handler": "embedding", "path": sparse},
        {"layer": shared.name, "class": "Dense", "handler": "multi_call",
         "path": "RowsPath(materialize=True)"}]
    # Calls of different shapes: per-example VJPs of each call, summed before the norm.
    shared = keras.layers.Dense(3)
    inputs = keras.Input((5, 4))
    flat = keras.layers.Flatten()(inputs)
    outputs = shared(flat[:, :12]) + keras.layers.GlobalAveragePooling1D()(
        shared(keras.layers.Reshape((2, 4))(flat[:, :8])[:, :, :4] @ np.ones((4, 12), "float32")))
    model = make_private(keras.Model(inputs, outputs))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    model.fit(x, np.zeros(8), batch_size=4, verbose=0)
    assert layer_paths(model) == [{"layer": shared.name, "class": "Dense",
                                   "handler": "multi_call", "path": "multi_call[2]"}]
    with pytest.raises(ValueError, match="make_private"):
        layer_paths(keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)]))


@pytest.mark.parametrize("onednn", [True, False])
def test_how_kept_conv_gradients_are_formed(monkeypatch, onednn):
    """Blocks for a strided layer under TF's executor where its kernels are Eigen's;
    products per offset under XLA; else patches; EngineOptions.conv_blocks overrides."""
    monkeypatch.setattr(keras_bridge, "onednn_enabled", lambda: onednn)
    # The XLA step's options: no native op, no depthwise backprop (privacy/step/plan.py).
    xla_options = dict(native=False, depthwise_max_channel_pairs=0)
    src, params = _mnist_conv1(**xla_options)  # 196 rows, 64 × 16, stride 2: gradients kept
    assert conv.choose_path(src, params, BATCH, 1, xla=True) == conv.ConvPath(
        False, False, True, "offsets")
    # The same layer outside XLA: blocks where TF's kernels are Eigen's, else patches.
    assert conv.choose_path(src, params, BATCH, 1).kept_by == ("patches" if onednn else "blocks")
    for forced, xla in itertools.product((True, False), (True, False)):
        src, params = _mnist_conv1(**xla_options, conv_blocks=forced)
        assert conv.choose_path(src, params, BATCH, 1, xla=xla).kept_by == (
            "blocks" if forced else "offsets" if xla else "patches")
    # A stride-1 layer whose gradients are kept: one product per offset under XLA only.
    src, params = _record(keras.layers.Conv2D(8, 3), (12, 12, 2), **xla_options)
    assert conv.choose_path(src, params, BATCH, 1, xla=True).kept_by == "offsets"
    assert conv.choose_path(src, params, BATCH, 1).kept_by == "patches"
    # Dilated: no blocks (offsets under XLA).
    src, params = _record(keras.layers.Conv2D(8, 3, dilation_rate=2), (12, 12, 2), **xla_options)
    assert conv.choose_path(src, params, BATCH, 1, xla=True).kept_by == "offsets"
    # A layer that takes the ghost norm keeps it under XLA (no gradients to materialize).
    src, params = _cifar_conv_8x8(**xla_options)
    path = conv.choose_path(src, params, BATCH, 1, xla=True)
    assert path.materialize is False and path.kept_by == "patches"
    # A forced depthwise backprop is still taken (norm_path="depthwise").
    src, params = _mnist_conv1(native=False, norm_path="depthwise")
    assert conv.choose_path(src, params, BATCH, 1, xla=True) == conv.ConvPath(False, True, True)
