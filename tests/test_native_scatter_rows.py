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
"""The native row scatter (privacy/native/cc/scatter_rows.cc) against tf.scatter_nd, and its use
by the book-keeping sum (step/clipped_sum.dense_rows): the same values bit for bit."""

import warnings

import numpy as np
import pytest
from native_calls import record_calls

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import EngineOptions, make_private, native
from tf_tempered.privacy.native import library
from tf_tempered.privacy.step import clipped_sum

needs_op = pytest.mark.skipif(library._compiler() is None,  # pylint: disable=protected-access
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")


def _rows(num_rows, count, d, dtype, index_dtype, seed=0):
    rng = np.random.default_rng(seed)
    # Zipf ids: most rows never hit, a few hit many times (the duplicates' order matters).
    ids = np.minimum(rng.zipf(1.3, count) - 1, max(num_rows - 1, 0)).astype(index_dtype)
    return tf.constant(ids), tf.constant(rng.standard_normal((count, d)), dtype)


@needs_op
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("num_rows, count, d", [(50_000, 4096, 64), (7, 50, 3), (1, 9, 5),
                                                (300, 0, 4)])
def test_equals_scatter_nd_bit_for_bit(num_rows, count, d, dtype, index_dtype):
    ids, values = _rows(num_rows, count, d, dtype, index_dtype)
    got = native.scatter_rows(ids, values, num_rows)
    want = tf.scatter_nd(ids[:, None], values, [num_rows, d])
    assert got.dtype == values.dtype and got.shape == (num_rows, d)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
    if count:
        assert np.count_nonzero(got.numpy())


@needs_op
def test_in_a_function_with_unknown_sizes():
    ids, values = _rows(1000, 700, 8, "float32", "int64", seed=1)
    fn = tf.function(lambda i, v: native.scatter_rows(i, v, 1000),
                     input_signature=[tf.TensorSpec([None], tf.int64),
                                      tf.TensorSpec([None, None], tf.float32)])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [1000, None]
    np.testing.assert_array_equal(fn(ids, values).numpy(),
                                  tf.scatter_nd(ids[:, None], values, [1000, 8]).numpy())


@needs_op
@pytest.mark.parametrize("bad", [-1, 10])
def test_an_index_out_of_range_is_an_error(bad):
    ids = tf.constant([0, bad, 3], tf.int64)
    with pytest.raises(tf.errors.InvalidArgumentError, match="not in \\[0, 10\\)"):
        native.scatter_rows(ids, tf.ones([3, 2]), 10)


@needs_op
@pytest.mark.parametrize("use_native", [True, False])
def test_dense_rows_takes_the_op_only_when_asked(monkeypatch, use_native):
    calls = record_calls(monkeypatch, "scatter_rows")
    ids, values = _rows(20, 30, 4, "float32", "int64", seed=2)
    slices = tf.IndexedSlices(values, ids, tf.constant([20, 4], tf.int64))
    got = clipped_sum.dense_rows(slices, (20, 4), native=use_native)
    assert calls == ([1] if use_native else [])
    assert got.shape == (20, 4)
    np.testing.assert_array_equal(got.numpy(),
                                  tf.scatter_nd(ids[:, None], values, [20, 4]).numpy())


@needs_op
def test_dense_rows_keeps_tf_for_half_precision(monkeypatch):
    calls = record_calls(monkeypatch, "scatter_rows")
    ids, values = _rows(20, 30, 4, "float16", "int64", seed=3)
    slices = tf.IndexedSlices(values, ids, tf.constant([20, 4], tf.int64))
    got = clipped_sum.dense_rows(slices, (20, 4), native=True)
    assert not calls and got.dtype == tf.float16


def _embedding_update(options, monkeypatch):
    calls = record_calls(monkeypatch, "scatter_rows")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input([6], dtype="int32"), keras.layers.Embedding(40, 5),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    with warnings.catch_warnings():  # noise_multiplier=0: exact updates to compare
        warnings.simplefilter("ignore")
        model = make_private(model, l2_norm_clip=0.5, noise_multiplier=0.0, options=options)
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()[0]
    ids = np.random.default_rng(4).integers(0, 40, (16, 6)).astype("int32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(ids, np.arange(16) % 3, batch_size=16, shuffle=False, verbose=0)
    return model.get_weights()[0] - before, calls


@needs_op
@pytest.mark.parametrize("clipped_sum_mode", ["bookkeeping", "second_pass", "recompute"])
def test_the_engine_densifies_an_embedding_by_the_op_with_tfs_values(monkeypatch,
                                                                     clipped_sum_mode):
    with_op, calls = _embedding_update(EngineOptions(clipped_sum=clipped_sum_mode), monkeypatch)
    assert calls, f"the {clipped_sum_mode} sum did not take the native scatter"
    without, calls_off = _embedding_update(
        EngineOptions(clipped_sum=clipped_sum_mode, native=False), monkeypatch)
    assert not calls_off
    assert np.count_nonzero(with_op)
    np.testing.assert_array_equal(with_op, without)


@needs_op
@pytest.mark.parametrize("clipped_sum_mode", ["second_pass", "recompute"])
def test_two_pass_sums_update_an_embedding_as_the_book_keeping_sum(monkeypatch,
                                                                   clipped_sum_mode):
    two_pass, _ = _embedding_update(EngineOptions(clipped_sum=clipped_sum_mode), monkeypatch)
    book_keeping, _ = _embedding_update(EngineOptions(), monkeypatch)
    np.testing.assert_allclose(two_pass, book_keeping, rtol=1e-5, atol=1e-7)
