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
"""The native Box–Muller op (privacy/native/cc/box_muller.cc) against TF's ops, and its use.

The reference is DPRandomness.box_muller's TF ops on the same key and counters: the same
Philox bits, so the values agree to the float32 rounding of log, sin and cos; a wrong bit,
block or word would give unrelated normals.
"""

import warnings

import numpy as np
import pytest
from native_calls import record_calls

import noise_statistics
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import EngineOptions, errors, hardened_noise, make_private, randomness
from tf_tempered.privacy import native
from tf_tempered.privacy.native import library

needs_op = pytest.mark.skipif(library._compiler() is None,
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")


def _source(seed=3):
    with warnings.catch_warnings():  # public seeds: tests only
        warnings.simplefilter("ignore")
        return randomness.DPRandomness("native noise test", insecure_dp_seed=seed)


def _assert_same_normals(got, want, stddev):
    # Equal to float32 rounding: a few ulps of r for r·cos θ (cos θ near 0 has an absolute,
    # not relative, error), so the bound is relative to the pair's radius.
    (cos_g, sin_g), (cos_w, sin_w) = [(a.numpy(), b.numpy()) for a, b in (got, want)]
    radius = np.hypot(cos_w, sin_w)
    for g, w in ((cos_g, cos_w), (sin_g, sin_w)):
        assert g.shape == w.shape and g.dtype == np.float32
        assert np.all(np.abs(g - w) <= 1e-6 * radius + 1e-6 * stddev * 1e-3), \
            np.max(np.abs(g - w) / radius)


@needs_op
@pytest.mark.parametrize("num_pairs", [0, 1, 2, 3, 37, 2048, 2049, 100_003])
@pytest.mark.parametrize("stream, counter", [(0, 0), (2, 5), (7, 2**40 + 3)])
def test_native_pairs_equal_tf_ops(num_pairs, stream, counter):
    source = _source()
    want = source.box_muller(num_pairs, stddev=1.7, counter=counter, stream=stream)
    got = source.box_muller(num_pairs, stddev=1.7, counter=counter, stream=stream,
                            pair_op=native.box_muller)
    _assert_same_normals(got, want, 1.7)


def _tf_pairs(key, radius_counter, angle_counter, num_pairs, stddev):
    """box_muller's TF ops at explicit counters (the reference for any counter)."""
    shape = tf.constant([num_pairs], tf.int64)
    bits = tf.raw_ops.StatelessRandomUniformFullIntV2(shape=shape, key=key,
                                                      counter=radius_counter, alg=1,
                                                      dtype=tf.uint64)
    u1 = (tf.cast(bits, tf.float32) + 0.5) * (2.0 ** -64)
    u2 = tf.raw_ops.StatelessRandomUniformV2(shape=shape, key=key, counter=angle_counter,
                                             alg=1, dtype=tf.float32)
    radius = tf.sqrt(-2.0 * tf.math.log(u1)) * stddev
    angle = tf.cast(2.0 * np.pi, tf.float32) * u2
    return radius * tf.cos(angle), radius * tf.sin(angle)


@needs_op
@pytest.mark.parametrize("num_pairs", [257, 3 * 2048 + 5], ids=["part-chunk", "full-chunks"])
@pytest.mark.parametrize("low", [2**64 - 5, 2**64 - 1, 2**32 - 3, 2**32 - 2000])
def test_counter_carries_into_the_high_word_as_tfs_philox(low, num_pairs):
    # Blocks past 2^64 - 1 in the low word carry into the high one (TF's Philox Skip); past
    # 2^32 - 1 into the low word's upper half. Full chunks of 2048 pairs take the vector
    # path (AVX-512), their counters set up in registers: both cross the carries here.
    key = tf.constant([0x0123456789ABCDEF], tf.uint64)
    counters = [tf.constant([low, 9], tf.uint64), tf.constant([low - 1000, 2**63 + 1], tf.uint64)]
    got = native.box_muller(key, counters[0], counters[1], num_pairs, 0.5)
    _assert_same_normals(got, _tf_pairs(key, counters[0], counters[1], num_pairs, 0.5), 0.5)


@needs_op
@pytest.mark.parametrize("sizes", [[1], [3, 2, 4], [9], [2, 0, 5, 0], [0, 7], [5, 6],
                                   [6, 5], [40_000, 3 * 2048 + 7, 1], [1, 100_003, 64]])
def test_pieces_equal_the_halves_cut_up(sizes):
    """The pieces op: the same bits as the pair op's halves [cos; sin] cut at ``sizes`` (the
    pieces across the middle, odd totals, empty pieces), and TF's ops to float32 rounding."""
    source = _source(4)
    got = source.normal_pieces(sizes, stddev=1.3, counter=6, stream=1,
                               pieces_op=native.box_muller_pieces)
    by_pairs = source.normal_pieces(sizes, stddev=1.3, counter=6, stream=1,
                                    pair_op=native.box_muller)
    by_tf = source.normal_pieces(sizes, stddev=1.3, counter=6, stream=1)
    assert [int(p.shape[0]) for p in got] == sizes
    for piece, pair_piece, tf_piece in zip(got, by_pairs, by_tf):
        assert piece.dtype == tf.float32
        np.testing.assert_array_equal(piece.numpy(), pair_piece.numpy())
        np.testing.assert_allclose(piece.numpy(), tf_piece.numpy(), rtol=0, atol=1e-6 * 1.3 * 10)


@needs_op
def test_pieces_in_a_function_keep_static_sizes():
    source = _source(5)
    fn = tf.function(lambda c: source.normal_pieces([4, 7], stddev=1.0, counter=c,
                                                    pieces_op=native.box_muller_pieces))
    shapes = [o.shape.as_list() for o in
              fn.get_concrete_function(tf.TensorSpec([], tf.int64)).structured_outputs]
    assert shapes == [[4], [7]]
    first, second = fn(tf.constant(2, tf.int64))
    assert not np.array_equal(first.numpy(), fn(tf.constant(3, tf.int64))[0].numpy())
    assert second.shape == (7,)


@needs_op
def test_hardened_noise_takes_the_op_too():
    source = _source(5)
    want = hardened_noise.sum_of_gaussians(source, [999], stddev=2.0, counter=4)
    got = hardened_noise.sum_of_gaussians(source, [999], stddev=2.0, counter=4,
                                          pair_op=native.box_muller)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=4e-6 * 2.0 * 9.5)


@needs_op
def test_float64_draws_keep_tfs_ops():
    def refuse(*args):
        raise AssertionError("the float32 op was used for float64")
    source = _source()
    want = source.box_muller(11, stddev=1.0, counter=1, dtype=tf.float64)
    got = source.box_muller(11, stddev=1.0, counter=1, dtype=tf.float64, pair_op=refuse)
    np.testing.assert_array_equal(got[0].numpy(), want[0].numpy())


def _noise_update(options, monkeypatch, calls):
    for name in ("box_muller", "box_muller_pieces"):
        record_calls(monkeypatch, name, lambda args, kwargs, name=name: name, calls=calls)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((50,)), keras.layers.Dense(40, use_bias=False),
                              keras.layers.Dense(30, use_bias=False)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = make_private(model, options=options, insecure_dp_seed=7)
    return noise_statistics.noise_updates(model, clip=1.0, sigma=1.3, steps=2)


@needs_op
def test_engine_draws_its_noise_with_the_op_and_the_same_values(monkeypatch):
    native_calls, tf_calls = [], []
    with_op = _noise_update(EngineOptions(), monkeypatch, native_calls)
    without = _noise_update(EngineOptions(native=False), monkeypatch, tf_calls)
    # Traced once per fit call with the op: the engine's noise is drawn in its pieces.
    assert native_calls and set(native_calls) == {"box_muller_pieces"} and not tf_calls
    for step_a, step_b in zip(with_op, without):
        for a, b in zip(step_a, step_b):
            assert np.abs(a).max() > 0.05  # noise / expected batch 10, σC = 1.3
            np.testing.assert_allclose(a, b, rtol=0, atol=1e-6 * np.abs(b).max())


@needs_op
def test_native_noise_is_gaussian_with_the_right_scale():
    source = randomness.DPRandomness("native noise statistics")  # secret key
    draw = source.normal([200_001], stddev=2.5, counter=0, pair_op=native.box_muller)
    noise_statistics.assert_gaussian_draw(draw.numpy(), 2.5)  # pairs (cos_i, sin_i) too


def test_no_op_under_xla_or_when_switched_off(monkeypatch):
    def refuse(*args):
        raise AssertionError("native noise op used")
    monkeypatch.setattr(native, "box_muller", refuse)
    monkeypatch.setattr(native, "box_muller_pieces", refuse)
    for jit_compile, options in ((True, EngineOptions()), (False, EngineOptions(native=False))):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0,
                                 options=options, insecure_dp_seed=1)
        model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=jit_compile,
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        before = model.get_weights()
        model.fit(np.ones([8, 4], np.float32), np.zeros([8]), batch_size=8, verbose=0)
        assert not np.allclose(before[0], model.get_weights()[0])  # it trained, with TF's noise


def test_small_models_do_not_build_the_library_for_their_noise(monkeypatch, tmp_path):
    monkeypatch.setitem(library._state, "loaded", False)
    monkeypatch.setitem(library._state, "module", None)
    monkeypatch.setattr(library, "library_path", lambda: tmp_path / "native_ops-missing.so")
    monkeypatch.delenv("TF_TEMPERED_NATIVE", raising=False)
    builds = []

    def failing_build():
        builds.append(1)
        raise errors.NativeBuildError("no compiler here")
    monkeypatch.setattr(library, "build", failing_build)
    assert not native.usable(native.BUILD_MIN_VALUES - 1) and not builds
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert not native.usable(native.BUILD_MIN_VALUES)  # tried: TF ops
    assert builds == [1]


@needs_op
def test_a_built_library_draws_small_models_noise_too():
    native.build()
    assert native.usable(10)
