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
"""EngineOptions(noise=...): the hardened sampler's statistics, the default's bits pinned,
the option validated, reaching the DP step, and saved with the model."""

import hashlib
import importlib.util
import pathlib
import warnings

import numpy as np
import pytest
import noise_statistics
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import errors
from tf_tempered.privacy import EngineOptions, make_private, randomness
from tf_tempered.privacy.hardened_noise import sum_of_gaussians
from tf_tempered.privacy import native
from tf_tempered.privacy.options import NOISE_MODES
from tf_tempered.privacy.state import get_state

# The zero batch is a plain tf.data pipeline (accounted as shuffled batches): not the point here.
pytestmark = pytest.mark.filterwarnings("ignore:fit on a pipeline tf_tempered did not build")


def _insecure(purpose, seed):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.InsecureDPRandomnessWarning)
        return randomness.DPRandomness(purpose, insecure_dp_seed=seed)


def test_the_option_defaults_to_the_fast_sampler_and_is_validated():
    assert EngineOptions().noise == "gaussian"
    assert EngineOptions(noise="sum_of_gaussians").noise == "sum_of_gaussians"
    assert set(NOISE_MODES) == set(randomness.SAMPLERS)
    for bad in ("discrete_gaussian", "Gaussian", 4, None):
        with pytest.raises(ValueError, match="EngineOptions.noise must be one of gaussian, "
                                             "sum_of_gaussians; got"):
            EngineOptions(noise=bad)
    with pytest.raises(ValueError, match="mode must be one of gaussian, sum_of_gaussians"):
        randomness.gaussian_noise_like([tf.zeros([2])], 1.0, _insecure("noise", 1), 1,
                                       mode="laplace")


def test_the_default_draw_is_pinned():
    """Values recorded (TF 2.21, CPU, both Kerases) for insecure_dp_seed=2026: a change to the
    default draw shows here. Changed on purpose when u₁ moved to float64 (tails to 8.49σ),
    when the angle became its own float32 draw (box_muller_uniforms), and when u₁ became
    (k + ½)·2⁻⁶⁴ from 64 random bits (tails to 9.49σ)."""
    source = _insecure("noise", 2026)
    variables = [tf.zeros([7, 5]), tf.zeros([5])]
    noise = randomness.gaussian_noise_like(variables, 0.5, source, tf.constant(3, tf.int64))
    flat = np.concatenate([n.numpy().ravel() for n in noise])
    np.testing.assert_array_equal(flat[:4], np.float32(
        [-0.20375414192676544, -0.9372772574424744, -0.23848824203014374, 0.10291600227355957]))
    assert hashlib.sha256(flat.tobytes()).hexdigest() == (
        "093b445f6b6400f0409bb0808321203042d1c12d55fd3d5039b613ff5e638b2a")
    np.testing.assert_array_equal(flat, source.normal([40], stddev=0.5, counter=3).numpy())


def test_the_four_terms_come_from_four_box_muller_pairs():
    """box_muller's pair j is (r_j cos θ_j, r_j sin θ_j) at index j of both halves (checked
    against r_j from the uniforms); the 4 values sum_of_gaussians adds up for one
    coordinate come from 4 different pairs (r cos θ + r sin θ would be one sample)."""
    source = _insecure("noise", 11)
    for size in (1, 2, 3, 7):
        m = max(size, 2)
        cos, sin = (h.numpy().astype(np.float64)
                    for h in source.box_muller(2 * m + 1, stddev=0.5, counter=2))
        # pylint: disable-next=protected-access
        key, counter = source._key_counter(tf.constant(2, tf.int64), 0)
        bits = tf.raw_ops.StatelessRandomUniformFullIntV2(
            shape=[2 * m + 1], key=key, counter=counter, alg=1, dtype=tf.uint64).numpy()
        radius = 0.5 * np.sqrt(-2.0 * np.log((bits.astype(np.float64) + 0.5) * 2.0 ** -64))
        np.testing.assert_allclose(cos ** 2 + sin ** 2, radius ** 2, rtol=1e-5)
        rows = np.arange(m)[:, None]
        pairs = np.concatenate([rows, rows + m, rows + 1, rows + m + 1], axis=1)
        assert all(len(set(row)) == 4 for row in pairs), size
        expected = cos[:m] + cos[m:2 * m] + sin[1:m + 1] + sin[m + 1:]
        drawn = sum_of_gaussians(source, [size], stddev=1.0, counter=2).numpy()
        np.testing.assert_allclose(drawn, expected[:size], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_the_tail_reaches_9_49_sigma_in_every_dtype(dtype, monkeypatch):
    """u₁ = (k + ½)·2⁻⁶⁴ at k = 0, its smallest, gives r = √(130 ln 2)·σ ≈ 9.49σ whatever the
    output dtype (float32 holds 2⁻⁶⁵): float32 uniforms (smallest 1 − u: 2⁻²³) would truncate
    the Gaussian at 5.65σ, a leak that adds ≈ T·q·Q(5.65 − 1/σ) to δ unaccounted. At the
    largest k, u₁ rounds to 1 and r = 0 (no NaN). (The angle's draw bounds nothing.)"""
    asked = []
    real = tf.raw_ops.StatelessRandomUniformFullIntV2

    def extreme_bits(shape, key, counter, alg, dtype):
        asked.append(dtype)
        drawn = real(shape=shape, key=key, counter=counter, alg=alg, dtype=dtype)
        return tf.where(tf.range(tf.size(drawn)) < 2, tf.zeros_like(drawn),
                        tf.fill(tf.shape(drawn), tf.constant(2 ** 64 - 1, tf.uint64)))

    monkeypatch.setattr(tf.raw_ops, "StatelessRandomUniformFullIntV2", extreme_bits)
    cos, sin = _insecure("noise", 3).box_muller(4, stddev=2.0, counter=1, dtype=dtype)
    assert asked == [tf.uint64] and cos.dtype == dtype
    radius = np.hypot(cos.numpy(), sin.numpy())
    np.testing.assert_allclose(radius[:2], 2.0 * np.sqrt(130 * np.log(2.0)), rtol=1e-5)
    np.testing.assert_array_equal(radius[2:], 0.0)


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_sum_of_gaussians_is_gaussian_with_the_asked_stddev(dtype):
    """As tests/test_randomness.py checks the default: KS, moments, tail mass, and the two
    halves of the draw (which share Box–Muller pairs) uncorrelated; odd size, 2-D shape."""
    source = randomness.DPRandomness("noise")
    draw = sum_of_gaussians(source, [400_001], stddev=3.0, counter=5, dtype=dtype).numpy()
    assert draw.shape == (400_001,) and draw.dtype == dtype.as_numpy_dtype
    noise_statistics.assert_gaussian_draw(draw, 3.0)
    matrix = sum_of_gaussians(source, [3, 7], stddev=1.0, counter=6, dtype=dtype).numpy()
    assert matrix.shape == (3, 7) and len(np.unique(matrix)) == 21
    assert sum_of_gaussians(source, [1], stddev=1.0, counter=7).shape == (1,)


def test_sum_of_gaussians_compiles_with_xla():
    source = randomness.DPRandomness("noise")

    @tf.function(jit_compile=True)
    def step():
        return randomness.gaussian_noise_like([tf.zeros([3, 2])], 2.0, source,
                                              source.next_counter(), mode="sum_of_gaussians")

    (first,), (second,) = step(), step()
    assert first.shape == (3, 2) and not np.array_equal(first.numpy(), second.numpy())


@pytest.mark.parametrize("noise", NOISE_MODES)
def test_dp_step_noise_std_and_independence(noise):
    """tests/test_engine.py's noise statistics, for every sampler."""
    clip, sigma, expected = 0.7, 1.3, 10.0
    model = noise_statistics.zero_gradient_model(noise)
    updates = noise_statistics.noise_updates(model, clip=clip, sigma=sigma, steps=2)
    std = sigma * clip / expected
    assert sum(u.size for u in updates[0]) == 2000 + 1200
    noise_statistics.assert_noise_updates(updates, std)


@pytest.mark.filterwarnings("ignore::tf_tempered.privacy.InsecureDPRandomnessWarning")
def test_the_step_draws_with_the_chosen_sampler_and_the_default_is_pinned():
    """With insecure_dp_seed=5 the first update is -noise / 10 of that key's counter 1. The
    default's bits by TF's ops are pinned (both Kerases, TF 2.21 CPU; recorded with u₁ from 64
    random bits and the angle its own float32 draw). The native op's last bits follow the
    CPU's vector instructions (FMA): it is held to these values in tests/test_native_noise.py."""
    updates = {}
    for noise in NOISE_MODES:
        model = noise_statistics.zero_gradient_model(noise, insecure_dp_seed=5, native=False)
        (update,) = noise_statistics.noise_updates(model, clip=0.7, sigma=1.3, steps=1)
        updates[noise] = np.concatenate([u.ravel() for u in update])
        drawn = randomness.gaussian_noise_like(model.trainable_variables, 0.7 * 1.3,
                                               _insecure("noise", 5), 1, mode=noise)
        np.testing.assert_allclose(
            updates[noise], -np.concatenate([d.numpy().ravel() for d in drawn]) / 10.0,
            rtol=1e-6, atol=1e-7)  # float sums, maybe in another order
    assert hashlib.sha256(updates["gaussian"].tobytes()).hexdigest() == (
        "9c61832edb3fdd80b9236b856b1d27c3672ca79d935fd3dc2984c0b5636618cf")
    assert not np.array_equal(updates["gaussian"], updates["sum_of_gaussians"])


def test_the_option_is_saved_with_the_model(tmp_path):
    model = noise_statistics.zero_gradient_model("sum_of_gaussians")
    noise_statistics.noise_updates(model, clip=1.0, sigma=1.0, steps=1)
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    make_private(loaded)  # without arguments: the settings saved with it
    assert get_state(loaded).options == get_state(model).options
    assert get_state(loaded).options.noise == "sum_of_gaussians"


def test_the_benchmark_times_both_samplers():
    """benchmarks/noise_modes.py (benchmarks/results/noise_modes.md) still runs: one round."""
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "noise_modes.py"
    spec = importlib.util.spec_from_file_location("noise_modes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with_op = native.usable()
    results = module.interleaved(module.draw_runs(1000, with_native=with_op), rounds=1,
                                 repeats=1)
    assert set(results) == set(NOISE_MODES) | ({m + " (TF ops)" for m in NOISE_MODES}
                                               if with_op else set())
    assert all(ms > 0 and cpu_ms >= 0 for ms, cpu_ms, _ in results.values())
