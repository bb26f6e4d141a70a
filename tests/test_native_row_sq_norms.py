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
"""The native row norms (privacy/native/cc/row_sq_norms.cc) against float64 sums of squares,
and their use for materialized per-microbatch gradients (clip_weights.row_sq_norms)."""

import warnings

import numpy as np
import pytest
from native_calls import record_calls

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import EngineOptions, make_private, native
from tf_tempered.privacy.layer_grads import clip_weights
from tf_tempered.privacy.native import library

needs_op = pytest.mark.skipif(library._compiler() is None,  # pylint: disable=protected-access
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")


@needs_op
@pytest.mark.parametrize("dtype, rtol", [("float32", 2e-6), ("float64", 1e-13)])
@pytest.mark.parametrize("rows, k", [(256, 8192), (7, 33), (3, 16), (5, 1), (4, 0), (0, 9)])
def test_equals_the_float64_sum_of_squares(rows, k, dtype, rtol):
    x = np.random.default_rng(rows + k).standard_normal((rows, k)) * 3
    got = native.row_sq_norms(tf.constant(x, dtype))
    assert got.dtype == dtype and got.shape == (rows,)
    np.testing.assert_allclose(got.numpy(), (x.astype(dtype).astype("float64") ** 2).sum(1),
                               rtol=rtol)


@needs_op
def test_in_a_function_with_unknown_sizes_and_refuses_other_ranks():
    fn = tf.function(native.row_sq_norms, input_signature=[tf.TensorSpec([None, None])])
    assert fn.get_concrete_function().structured_outputs.shape.as_list() == [None]
    np.testing.assert_allclose(fn(tf.constant([[3.0, 4.0], [0.0, 2.0]])).numpy(), [25.0, 4.0])
    with pytest.raises(tf.errors.InvalidArgumentError, match="a matrix \\[R, K\\] expected"):
        native.row_sq_norms(tf.ones([2, 3, 4]))  # eagerly: the kernel's check
    with pytest.raises(ValueError, match="rank 2"):  # traced: the shape function's
        tf.function(native.row_sq_norms).get_concrete_function(tf.TensorSpec([2, 3, 4]))


@needs_op
@pytest.mark.parametrize("native_allowed", [True, False])
def test_row_sq_norms_takes_the_op_only_when_allowed(monkeypatch, native_allowed):
    native.load()  # built: a small matrix alone does not build it (next test)
    calls = record_calls(monkeypatch, "row_sq_norms")
    x = tf.constant(np.random.default_rng(0).standard_normal((6, 40)), tf.float32)
    got = clip_weights.row_sq_norms(x, EngineOptions(native=native_allowed))
    assert calls == ([1] if native_allowed else [])
    np.testing.assert_allclose(got.numpy(), tf.reduce_sum(tf.square(x), 1).numpy(), rtol=1e-5)
    # Half precision, no options, and a non-matrix keep TF's ops.
    calls.clear()
    clip_weights.row_sq_norms(tf.cast(x, tf.float16), EngineOptions())
    clip_weights.row_sq_norms(x)
    assert not calls


@needs_op
def test_small_rows_do_not_build_the_library(monkeypatch, tmp_path):
    """A first build (15-60 s) only for BUILD_MIN_VALUES values: a small model's norms would
    not repay it."""
    state = library._state  # pylint: disable=protected-access
    monkeypatch.setattr(library, "_state", {**state, "loaded": False})
    monkeypatch.setattr(library, "library_path", lambda: tmp_path / "absent.so")
    built = []
    monkeypatch.setattr(library, "available", lambda: built.append(1) or True)
    calls = record_calls(monkeypatch, "row_sq_norms")
    clip_weights.row_sq_norms(tf.ones([6, 40]), EngineOptions())
    assert not calls and not built
    assert library.usable(library.BUILD_MIN_VALUES) and built  # a large one would


def _dense_update(options, monkeypatch):
    calls = record_calls(monkeypatch, "row_sq_norms")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input([5, 12]), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)])
    with warnings.catch_warnings():  # noise_multiplier=0: exact updates to compare
        warnings.simplefilter("ignore")
        model = make_private(model, l2_norm_clip=0.05, noise_multiplier=0.0, options=options)
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    x = np.random.default_rng(1).standard_normal((16, 5, 12)).astype("float32")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, np.arange(16) % 3, batch_size=16, shuffle=False, verbose=0)
    return [w - b for w, b in zip(model.get_weights(), before)], calls


@needs_op
def test_the_engine_takes_the_op_for_materialized_gradients_with_tfs_update(monkeypatch):
    """Binding clipping (C = 0.05): the norms decide every update; the op's and TF's agree."""
    native.load()
    with_op, calls = _dense_update(EngineOptions(norm_path="materialize"), monkeypatch)
    assert calls, "the materialized gradients' norms did not take the native op"
    without, calls_off = _dense_update(EngineOptions(norm_path="materialize", native=False),
                                       monkeypatch)
    assert not calls_off
    for a, b in zip(with_op, without):
        assert np.count_nonzero(a)
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-8)
