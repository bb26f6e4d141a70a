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
"""tf_tempered.privacy.randomness: secret keys, the opt-in's streams, and no key in any
written file (the seeds themselves: tests/test_dp_seeds.py)."""

import numpy as np
import pytest

import noise_statistics
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import errors
from tf_tempered.privacy import DPKerasSGDOptimizer, dp_seeds, make_private, randomness
from tf_tempered.privacy.state import get_state


@pytest.fixture
def fresh_warning(monkeypatch):
    """Re-arms the once-per-process warning of the insecure opt-in."""
    monkeypatch.setattr(dp_seeds, "_warned", False)


@pytest.fixture
def drawn_secrets(monkeypatch):
    """Every secret randomness draws from the OS in this test, as ints."""
    drawn = []
    real = randomness.secrets.randbits

    def recording(k):
        value = real(k)
        drawn.append(value)
        return value

    monkeypatch.setattr(randomness.secrets, "randbits", recording)
    return drawn


def _draw(source, counter=1):
    return source.normal([64], stddev=1.0, counter=counter).numpy()


def test_secret_streams_differ_and_the_opt_in_reproduces(fresh_warning):
    a, b = randomness.DPRandomness("noise"), randomness.DPRandomness("noise")
    assert a.is_secret and b.is_secret
    assert not np.array_equal(_draw(a), _draw(b))
    with pytest.warns(errors.InsecureDPRandomnessWarning):
        c = randomness.DPRandomness("noise", insecure_dp_seed=3)
    d = randomness.DPRandomness("noise", insecure_dp_seed=3)
    assert not c.is_secret and "insecure_dp_seed=3" in repr(c)
    np.testing.assert_array_equal(_draw(c), _draw(d))
    # One seed, separate streams per purpose; a different seed, a different stream.
    assert not np.array_equal(_draw(c), _draw(randomness.DPRandomness("poisson",
                                                                      insecure_dp_seed=3)))
    assert not np.array_equal(_draw(c), _draw(randomness.DPRandomness("noise",
                                                                      insecure_dp_seed=4)))


def test_counter_gives_a_new_draw_each_time():
    source = randomness.DPRandomness("noise")
    counters = [int(source.next_counter()) for _ in range(3)]
    assert counters == [1, 2, 3]
    draws = [_draw(source, c) for c in counters]
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[1], draws[2])
    np.testing.assert_array_equal(_draw(source, 2), draws[1])  # stateless given the counter
    uniform = source.uniform([1000], counter=4).numpy()
    assert uniform.dtype == np.float64 and 0 <= uniform.min() and uniform.max() < 1
    assert abs(uniform.mean() - 0.5) < 5 * np.sqrt(1 / 12 / 1000)


def test_streams_share_no_philox_block():
    """Poisson shards draw from streams 0..R-1 of one key at the same counters: their
    values must not overlap (a stream in the low counter bits made stream s + 1 the draw
    of stream s shifted by one block, so two shards' examples shared their uniforms)."""
    source = randomness.DPRandomness("batches")
    draws = {(s, c): source.uniform([2000], counter=c, stream=s).numpy()
             for s in range(3) for c in (7, 8)}
    values = np.concatenate(list(draws.values()))
    assert len(np.unique(values)) == len(values)  # no value repeats across the 6 draws
    # and none is a shifted copy of another: their correlations are those of independent draws
    a, b = draws[(0, 7)], draws[(1, 7)]
    for shift in range(1, 5):
        assert abs(np.corrcoef(a[shift:], b[:-shift])[0, 1]) < 0.1
        assert abs(np.corrcoef(b[shift:], a[:-shift])[0, 1]) < 0.1
    # float64 normals: two independent draws of 1000 share a value with probability ~1e-10
    # (float32's spacing made a chance coincidence about 1 in 100: a flaky test).
    normal = [source.normal([1000], stddev=1.0, counter=3, stream=s, dtype=tf.float64).numpy()
              for s in (0, 1)]
    assert len(np.intersect1d(normal[0], normal[1])) == 0
    # float32, position by position (a shared block would repeat a whole run of values)
    normal = [source.normal([1000], stddev=1.0, counter=3, stream=s).numpy() for s in (0, 1)]
    assert np.sum(normal[0] == normal[1]) <= 1


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_radius_and_angle_uniforms_share_no_philox_block(dtype):
    """box_muller's two draws (64-bit radius words, dtype angle) start 2^47 blocks apart: no
    32-bit Philox word of one appears in the other, and they are uncorrelated at any small
    shift (a shared block would make them equal or shifted copies)."""
    source = randomness.DPRandomness("noise")
    radius, angle = (u.numpy() for u in source.box_muller_uniforms(5000, counter=9, dtype=dtype))
    compute = np.float64 if dtype == tf.float64 else np.float32
    assert radius.dtype == compute and angle.dtype == dtype.as_numpy_dtype
    # pylint: disable-next=protected-access
    key, counter = source._key_counter(tf.constant(9, tf.int64), 0)
    bits = tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=[5000], key=key, counter=counter, alg=1, dtype=tf.uint64).numpy()
    np.testing.assert_allclose(radius, (bits.astype(np.float64) + 0.5) * 2.0 ** -64, rtol=1e-7)
    # A float32 Philox uniform is the low 23 bits of one 32-bit word; a float64 one takes the
    # low 20 bits of its first word as its 20 leading mantissa bits. Compare those bits.
    bits_per_word = 23 if dtype == tf.float32 else 20
    low_bits = lambda words: set((words & np.uint64(2 ** bits_per_word - 1)).tolist())
    radius_words = low_bits(bits >> np.uint64(32)) | low_bits(bits & np.uint64(0xFFFFFFFF))
    angle_words = set((angle.astype(np.float64) * 2.0 ** bits_per_word).astype(np.int64).tolist())
    by_chance = len(radius_words) * len(angle_words) / 2 ** bits_per_word  # ≈ 6 or 48
    assert len(radius_words & angle_words) < 2 * by_chance + 20  # a shared block: thousands
    for shift in range(0, 5):
        assert abs(np.corrcoef(radius[shift:], angle[:len(angle) - shift])[0, 1]) < 0.06
        assert abs(np.corrcoef(angle[shift:], radius[:len(radius) - shift])[0, 1]) < 0.06


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_normal_is_gaussian_with_the_asked_stddev(dtype):
    """The Box–Muller draw against N(0, σ²): Kolmogorov–Smirnov, moments, tail mass, the
    two halves (cos and sin of one pair) uncorrelated, and an odd size and a 2-D shape."""
    source = randomness.DPRandomness("noise")
    draw = source.normal([400_001], stddev=3.0, counter=5, dtype=dtype).numpy()
    assert draw.shape == (400_001,) and draw.dtype == dtype.as_numpy_dtype
    noise_statistics.assert_gaussian_draw(draw, 3.0)
    matrix = source.normal([3, 7], stddev=1.0, counter=6, dtype=dtype).numpy()
    assert matrix.shape == (3, 7) and len(np.unique(matrix)) == 21


def test_draw_compiles_with_xla():
    source = randomness.DPRandomness("noise")

    @tf.function(jit_compile=True)
    def step():
        return source.normal([5], stddev=2.0, counter=source.next_counter())

    first, second = step().numpy(), step().numpy()
    assert first.shape == (5,) and not np.array_equal(first, second)


def _key_patterns(key):
    """The ways a 64-bit key could appear in a file: raw bytes, as int64, decimal, hex."""
    signed = key - (1 << 64) if key >= (1 << 63) else key
    return [key.to_bytes(8, "little"), key.to_bytes(8, "big"), str(key).encode(),
            str(signed).encode(), f"{key:x}".encode(), f"{key:X}".encode()]


def test_key_is_untracked_and_in_no_saved_file(tmp_path, drawn_secrets):
    model = make_private(keras.Sequential([keras.Input((6,)), keras.layers.Dense(4)]))
    (key,) = drawn_secrets  # the one secret make_private drew
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, reduction="none"))
    model.fit(np.ones((8, 6), np.float32), np.zeros(8), batch_size=8, epochs=2, verbose=0)
    state = get_state(model).noise
    assert int(state._counter.numpy()) == 2  # pylint: disable=protected-access
    hidden = {id(state._key), id(state._counter)}  # pylint: disable=protected-access
    assert not hidden & {id(v) for v in model.weights + model.variables}
    assert not hidden & {id(getattr(v, "value", v)) for v in model.weights + model.variables}
    assert "key" not in repr(state) and str(key) not in repr(state)

    model.save(tmp_path / "model.keras")
    model.save_weights(tmp_path / "model.weights.h5")
    prefix = tf.train.Checkpoint(model=model, optimizer=model.optimizer).save(tmp_path / "ckpt")
    names = [name for name, _ in tf.train.list_variables(prefix)]
    assert not [n for n in names if "dp" in n.lower()]
    # The model's part of the checkpoint is its weights and nothing more.
    if KERAS_MAJOR == 2:
        assert len([n for n in names if n.startswith("model/")]) == len(model.weights) == 2
    else:  # Keras 3 stores each variable once, the weights under the optimizer that tracks them
        entries = [n for n in names if n != "_CHECKPOINTABLE_OBJECT_GRAPH"
                   and not n.startswith("save_counter")]
        assert len(entries) == len({id(v) for v in model.weights + model.optimizer.variables})
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(files) >= 4
    for path in files:
        content = path.read_bytes()
        for pattern in _key_patterns(key):
            assert pattern not in content, (path.name, pattern)
    # Reloaded, the model is no longer private: nothing about the key travelled with it.
    reloaded = keras.models.load_model(tmp_path / "model.keras", compile=False)
    assert get_state(reloaded) is None
