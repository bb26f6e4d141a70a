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
"""Conformance of the convolution handlers: Conv1D, Conv2D, Conv3D, grouped, weight standardized.

Each handler, on every path it can take (TF ops, each strategy forced, the native op),
against the float64 per-microbatch reference: the "conv" family of
tests/conformance_cases.py on tests/conformance_harness.py (the grouped cases too: Keras
XLA-compiles grouped convolutions, which TF's CPU kernels differentiate only with oneDNN).
Then per-path references on the same reference (dp_reference.py) for what the cases
do not hold: dilated Conv2D in float32 and float64, with microbatches, of unknown spatial
size; TimeDistributed Conv2D; the paper's kind of CNN with a learnable TemperedSigmoid.
"""

import pytest

from conformance_cases import CONV_PATHS
from conformance_harness import BATCH_KINDS, SOME_MICROBATCHES, family_tests, random_batch
from dp_reference import assert_engine_matches_reference, seeded
from tf_tempered._compat import keras
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.privacy import EngineOptions
from tf_tempered.privacy import native

FAMILY = "conv"


(test_handler_update_equals_per_microbatch_reference,
 test_two_pass_clipped_sum_equals_per_microbatch_reference,
 test_each_layer_takes_its_handler) = family_tests(FAMILY)


# --- Per-path references -------------------------------------------------------
# (Keras 3 suite: on Keras 2 the cases above and the comparisons with TF Privacy stand in,
# tests/conftest.py.) The paths are the conv cases' (CONV_PATHS).

def _skip_without_native(path):
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")


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


# TF ops (no compiler, TF_TEMPERED_NATIVE=0, or a GPU): the rules' own choice (which took
# the depthwise path for the first layer), and each strategy forced; the native op, with
# per-microbatch gradients and with norms only (the book-keeping clipped sum, which used
# TF's backprop-filter op); input patches made in chunks of one microbatch.
_DILATED_PATHS = ["tf-auto", "tf-ghost", "tf-materialize", "native-auto",
                  "native-materialized", "native-norms-only", "tf-chunks"]


@pytest.mark.keras3_suite
@pytest.mark.cover_each()
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@BATCH_KINDS
@pytest.mark.parametrize("path", _DILATED_PATHS)
def test_dilated_conv2d_equals_per_example_reference(path, static_batch, dtype):
    _skip_without_native(path)
    options = EngineOptions(**CONV_PATHS[path])
    x, y = random_batch((10, 9, 2))
    assert_engine_matches_reference(seeded(_dilated_cnn), x, y, static_batch=static_batch,
                                    dtype=dtype, options=options)


@pytest.mark.keras3_suite
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "native-norms-only"])
def test_dilated_conv2d_with_microbatches_equals_reference(path):
    _skip_without_native(path)
    options = EngineOptions(**CONV_PATHS[path])
    x, y = random_batch((10, 9, 2), seed=1)
    assert_engine_matches_reference(seeded(_dilated_cnn), x, y, num_microbatches=4,
                                    static_batch=True, dtype="float64", options=options)


def _dilated_cnn_any_size(dtype):
    # Unknown height and width: no native op; patches by tf.image.extract_patches.
    return keras.Sequential([
        keras.Input((None, None, 2), dtype=dtype),
        keras.layers.Conv2D(3, 3, dilation_rate=2, padding="same", activation="tanh",
                            dtype=dtype),
        keras.layers.GlobalAveragePooling2D(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


@pytest.mark.keras3_suite
@pytest.mark.cover_each()
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "native-auto"])
def test_dilated_conv2d_of_unknown_size_equals_reference(path):
    options = EngineOptions(**CONV_PATHS[path])
    x, y = random_batch((10, 9, 2), seed=3)
    assert_engine_matches_reference(seeded(_dilated_cnn_any_size), x, y, dtype="float64",
                                    options=options)


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


@pytest.mark.keras3_suite
@pytest.mark.cover_each()
@BATCH_KINDS
@SOME_MICROBATCHES
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "tf-chunks",
                                  "native-auto", "native-norms-only"])
def test_time_distributed_conv2d_equals_reference(path, num_microbatches,
                                                  static_batch):
    _skip_without_native(path)
    options = EngineOptions(**CONV_PATHS[path])
    x, y = random_batch((3, 7, 6, 2))
    assert_engine_matches_reference(seeded(_time_distributed_cnn), x, y,
                                    num_microbatches=num_microbatches, static_batch=static_batch,
                                    options=options)


def _cnn_learnable(dtype):
    # The paper's kind of CNN: every path, some microbatches clipped.
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


@pytest.mark.keras3_suite
@pytest.mark.cover_each()
@BATCH_KINDS
@SOME_MICROBATCHES
@pytest.mark.parametrize("path", ["tf-auto", "tf-ghost", "tf-materialize", "tf-chunks",
                                  "native-auto", "native-materialized", "native-norms-only"])
def test_cnn_with_some_microbatches_clipped_equals_reference(path, num_microbatches,
                                                             static_batch):
    _skip_without_native(path)
    options = EngineOptions(**CONV_PATHS[path])
    x, y = random_batch((12, 12, 2), seed=2)
    assert_engine_matches_reference(seeded(_cnn_learnable), x, y,
                                    num_microbatches=num_microbatches, static_batch=static_batch,
                                    options=options)
