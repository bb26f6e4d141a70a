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
"""The per-layer path choice, on the layer shapes the thresholds were measured on."""

import types

import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import native, strategy

BATCH = 256


def _record(layer, input_shape, batch=BATCH):
    """A stand-in for a recorded layer: the tensors' shapes and dtype are all choose() reads."""
    layer.build((None,) + input_shape)
    x = tf.zeros((batch,) + input_shape)
    kind = "conv2d" if isinstance(layer, keras.layers.Conv2D) else "dense"
    return types.SimpleNamespace(kind=kind, layer=layer, inputs=x, grad_output=layer(x), cache={})


def _mnist_conv1():
    return _record(keras.layers.Conv2D(16, 8, strides=2, padding="same"), (28, 28, 1))


def _mnist_conv2():
    return _record(keras.layers.Conv2D(32, 4, strides=2, padding="same"), (7, 7, 16))


def _cifar_conv_8x8():
    return _record(keras.layers.Conv2D(128, 3, padding="same"), (8, 8, 64))


def _choice(record, num_microbatches=BATCH, examples_per_microbatch=1):
    rows = strategy.choose(record, num_microbatches, examples_per_microbatch)
    cache = record.cache
    return rows, cache["native"], cache["depthwise"], cache["materialize"]


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


def test_tf_ops_only(monkeypatch):
    monkeypatch.setattr(strategy, "_USE_NATIVE", False)
    assert _choice(_mnist_conv1()) == (196, False, True, True)  # 1×16 channel pairs: depthwise
    # conv2: d_in·d_out = 8192 > 16·288 rows·(d_in + d_out): ghost.
    assert _choice(_mnist_conv2()) == (16, False, False, False)
    # With a static count of microbatches but no static batch, rows are unbounded: materialize.
    assert _choice(_mnist_conv2(), 8, None)[1:] == (False, False, True)


def test_memory_cap_turns_materializing_off(monkeypatch):
    monkeypatch.setattr(strategy, "_USE_NATIVE", False)
    monkeypatch.setattr(strategy, "_DEPTHWISE_MAX_CHANNEL_PAIRS", 0)
    record = _record(keras.layers.Conv2D(8, 3), (12, 12, 2))  # 100 rows, 18×8 kernel
    assert _choice(record)[3] is True
    monkeypatch.setattr(strategy, "_MATERIALIZE_MAX_BYTES", BATCH * 18 * 8 * 4 - 1)
    assert _choice(_record(keras.layers.Conv2D(8, 3), (12, 12, 2)))[3] is False


def test_unknown_microbatch_count_decides_per_step(monkeypatch):
    monkeypatch.setattr(strategy, "_USE_NATIVE", False)
    monkeypatch.setattr(strategy, "_DEPTHWISE_MAX_CHANNEL_PAIRS", 0)
    record = _record(keras.layers.Conv2D(8, 3), (12, 12, 2))
    count = tf.constant(BATCH)
    materialize = _choice(record, count)[3]
    assert tf.is_tensor(materialize) and bool(materialize)
    monkeypatch.setattr(strategy, "_MATERIALIZE_MAX_BYTES", 1)
    assert not bool(_choice(_record(keras.layers.Conv2D(8, 3), (12, 12, 2)), count)[3])


@pytest.mark.parametrize("forced,expected", [("ghost", (False, False, False)),
                                             ("materialize", (False, False, True))])
def test_forced_tf_ops_strategies_skip_native_and_depthwise(monkeypatch, forced, expected):
    monkeypatch.setattr(strategy, "_FORCED_STRATEGY", forced)
    assert _choice(_mnist_conv1())[1:] == expected


@needs_native
def test_forced_native(monkeypatch):
    monkeypatch.setattr(strategy, "_FORCED_STRATEGY", "native")
    assert _choice(_cifar_conv_8x8())[1:3] == (True, False)


def test_input_width_and_rows():
    record = _mnist_conv2()
    assert strategy.input_width(record) == 4 * 4 * 16
    assert strategy.static_rows(record.grad_output, 3) == 48
    assert strategy.static_rows(tf.zeros((5, 7)), None) == 1
