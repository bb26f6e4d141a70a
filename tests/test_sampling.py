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
"""Tests for tf_tempered.privacy.sampling: the batches really are Poisson samples."""

import numpy as np
import pytest
from scipy import stats

from tf_tempered._compat import tf
from tf_tempered.privacy import errors
from tf_tempered.privacy import dp_seeds, sampling
from tf_tempered.privacy.sampling import poisson_batches, poisson_steps_per_epoch

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

N = 40
Q = 0.2
STEPS = 3000


def _data(n=N):
    """x row i is (i + 1, -(i + 1)) (never zero), y_i = 10·(i + 1): rows identify examples."""
    ids = np.arange(1, n + 1, dtype=np.float32)
    return np.stack([ids, -ids], axis=1), (10 * ids).astype(np.int64)


def _collect(dataset):
    """All elements as NumPy arrays stacked along a new leading axis (one fetch)."""
    x, y, info = next(iter(dataset.batch(1_000_000)))
    return x.numpy(), y.numpy(), info["mask"].numpy(), info["expected_batch_size"].numpy()


@pytest.fixture(scope="module")
def draws():
    x, y = _data()
    # The default, secret membership: the statistics below must hold for it.
    return _collect(poisson_batches(x, y, sampling_probability=Q, steps=STEPS))


def test_element_format(draws):
    x, y, mask, expected = draws
    mbs = sampling.default_max_batch_size(num_examples=N, sampling_probability=Q,
                                          total_steps=STEPS)
    assert x.shape == (STEPS, mbs, 2) and y.shape == (STEPS, mbs) and mask.shape == (STEPS, mbs)
    assert mask.dtype == np.float32 and set(np.unique(mask)) == {0.0, 1.0}
    assert expected.dtype == np.float32 and np.all(expected == np.float32(Q * N))
    spec = poisson_batches(*_data(), sampling_probability=Q, steps=2,
                           max_batch_size=17).element_spec
    assert spec[0].shape == (17, 2) and spec[1].shape == (17,)
    assert spec[2]["mask"].shape == (17,) and spec[2]["mask"].dtype == tf.float32
    assert spec[2]["expected_batch_size"].shape == ()
    assert spec[2]["expected_batch_size"].dtype == tf.float32


def test_real_rows_first_and_padding_is_zero(draws):
    x, y, mask, _ = draws
    counts = mask.sum(axis=1).astype(int)
    for step in range(200):
        c = counts[step]
        assert np.all(mask[step, :c] == 1.0) and np.all(mask[step, c:] == 0.0)
        assert np.all(x[step, c:] == 0) and np.all(y[step, c:] == 0)
        ids = x[step, :c, 0]
        assert np.all(ids >= 1) and len(set(ids)) == c  # real, distinct examples
        np.testing.assert_array_equal(x[step, :c, 1], -ids)
        np.testing.assert_array_equal(y[step, :c], 10 * ids)


# The draws are secret (not seeded), so every statistical check below can fail by chance: each
# threshold is set for a false alarm rate of at most ~1e-6 (z = 5 two-sided is 5.7e-7), so the
# whole file fails spuriously less than once in 10^5 CI runs, while a sampler off by a few
# percent in q, or with correlated inclusions (ρ > 0.11), still fails for sure.
Z = 5.0
FALSE_ALARM = 1e-6


def test_batch_sizes_follow_binomial(draws):
    counts = draws[2].sum(axis=1).astype(int)
    assert counts.mean() == pytest.approx(N * Q, abs=Z * np.sqrt(N * Q * (1 - Q) / STEPS))
    # Chi-square goodness of fit to Binomial(N, q), tails pooled so each bin expects >= 5.
    lo, hi = 2, 14
    binned = np.clip(counts, lo, hi)
    observed = np.array([(binned == k).sum() for k in range(lo, hi + 1)])
    probs = stats.binom.pmf(np.arange(lo, hi + 1), N, Q)
    probs[0] = stats.binom.cdf(lo, N, Q)
    probs[-1] = stats.binom.sf(hi - 1, N, Q)
    assert STEPS * probs.min() >= 5
    _, p_value = stats.chisquare(observed, STEPS * probs)
    assert p_value > FALSE_ALARM
    # And it would reject a wrong q.
    _, p_wrong = stats.chisquare(observed, STEPS * np.diff(np.concatenate(
        [[0.0], stats.binom.cdf(np.arange(lo, hi), N, 0.23), [1.0]])))
    assert p_wrong < 1e-6


def test_each_example_included_with_probability_q(draws):
    x, _, mask, _ = draws
    ids = x[..., 0][mask == 1.0].astype(int)
    counts = np.bincount(ids, minlength=N + 1)[1:]
    assert counts.sum() == mask.sum()
    # Two-sided binomial interval per example, Bonferroni-corrected over N examples.
    low, high = stats.binom.interval(1 - FALSE_ALARM / N, STEPS, Q)
    assert np.all((counts >= low) & (counts <= high)), counts
    # Inclusions of two examples are independent: co-inclusion is Bernoulli(q²) per step.
    a, b = (mask * (x[..., 0] == 1)).sum(1), (mask * (x[..., 0] == 2)).sum(1)
    co_inclusion_std = np.sqrt(Q * Q * (1 - Q * Q) / STEPS)
    assert (a * b).mean() == pytest.approx(Q * Q, abs=Z * co_inclusion_std)


@pytest.fixture
def fresh_warning(monkeypatch):
    """Re-arms the once-per-process warning of the insecure opt-in."""
    monkeypatch.setattr(dp_seeds, "_warned", False)


def test_insecure_dp_seed_reproduces_and_is_fresh_per_iteration(fresh_warning):
    x, y = _data()
    with pytest.warns(errors.InsecureDPRandomnessWarning, match="does NOT hold"):
        ds1 = poisson_batches(x, y, expected_batch_size=8, steps=20, insecure_dp_seed=7)
    ds2 = poisson_batches(x, y, expected_batch_size=8, steps=20, insecure_dp_seed=7)
    ds3 = poisson_batches(x, y, expected_batch_size=8, steps=20, insecure_dp_seed=8)
    first1, first2, first3 = _collect(ds1)[0], _collect(ds2)[0], _collect(ds3)[0]
    np.testing.assert_array_equal(first1, first2)
    assert not np.array_equal(first1, first3)
    # A new pass over the same dataset draws new batches, reproducibly.
    second1, second2 = _collect(ds1)[0], _collect(ds2)[0]
    np.testing.assert_array_equal(second1, second2)
    assert not np.array_equal(second1, first1)


def test_global_seed_does_not_control_membership():
    # Same global seed before each dataset (what --seed does): different batches.
    x, y = _data()
    tf.keras.utils.set_random_seed(0)
    a = _collect(poisson_batches(x, y, expected_batch_size=8, steps=20))[0]
    tf.keras.utils.set_random_seed(0)
    b = _collect(poisson_batches(x, y, expected_batch_size=8, steps=20))[0]
    assert not np.array_equal(a, b)


def test_seed_is_refused_with_the_fix():
    x, y = _data()
    with pytest.raises(ValueError, match=r"seed=0.*amplification by subsampling.*drop "
                                         r"seed=.*insecure_dp_seed=0"):
        poisson_batches(x, y, expected_batch_size=8, steps=20, seed=0)


def test_secret_membership_is_fresh_per_iteration():
    x, y = _data()
    ds = poisson_batches(x, y, expected_batch_size=8, steps=20)
    assert not np.array_equal(_collect(ds)[0], _collect(ds)[0])


def test_steps_per_epoch_and_cardinality():
    assert poisson_steps_per_epoch(num_examples=60000, expected_batch_size=256) == 234
    assert poisson_steps_per_epoch(num_examples=100, expected_batch_size=40) == 3  # 2.5 ↑
    assert poisson_steps_per_epoch(num_examples=100, expected_batch_size=100) == 1
    assert poisson_steps_per_epoch(num_examples=1000, sampling_probability=0.003) == 333
    x, y = _data()
    ds = poisson_batches(x, y, expected_batch_size=10, epochs=3)
    assert int(ds.cardinality()) == 3 * 4 == len(list(ds))
    ds = poisson_batches(x, y, expected_batch_size=10, steps=5)
    assert int(ds.cardinality()) == 5


def test_overflow_raises_naming_max_batch_size():
    x, y = _data(20)
    ds = poisson_batches(x, y, sampling_probability=0.5, steps=10, max_batch_size=3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="max_batch_size=3"):
        list(ds)


@pytest.mark.parametrize("kwargs,name", [
    (dict(steps=5), "expected_batch_size"),
    (dict(expected_batch_size=4, sampling_probability=0.1, steps=5), "sampling_probability"),
    (dict(expected_batch_size=0, steps=5), "expected_batch_size"),
    (dict(expected_batch_size=41, steps=5), "expected_batch_size"),
    (dict(sampling_probability=1.5, steps=5), "sampling_probability"),
    (dict(sampling_probability=0.0, steps=5), "sampling_probability"),
    (dict(expected_batch_size=4), "epochs"),
    (dict(expected_batch_size=4, epochs=1, steps=5), "epochs"),
    (dict(expected_batch_size=4, epochs=0), "epochs"),
    (dict(expected_batch_size=4, steps=-1), "steps"),
    (dict(expected_batch_size=4, steps=5, max_batch_size=0), "max_batch_size"),
    (dict(expected_batch_size=4, steps=5, seed=1), "seed=1"),
    (dict(expected_batch_size=4, steps=5, insecure_dp_seed=1.5), "insecure_dp_seed"),
    (dict(expected_batch_size=4, steps=5, insecure_dp_seed=True), "insecure_dp_seed"),
])
def test_bad_arguments(kwargs, name):
    x, y = _data()
    with pytest.raises(ValueError, match=name):
        poisson_batches(x, y, **kwargs)


def test_misaligned_labels():
    x, y = _data()
    with pytest.raises(ValueError, match="y must have one row per example"):
        poisson_batches(x, y[:-1], expected_batch_size=4, steps=5)


def test_unpadded_batches_hold_the_same_examples_as_padded_ones(fresh_warning):
    # The same insecure key: the same membership, padded to max_batch_size or not.
    x, y = _data()
    kwargs = dict(sampling_probability=Q, steps=50, insecure_dp_seed=3)
    padded = list(poisson_batches(x, y, **kwargs))
    unpadded_ds = poisson_batches(x, y, fixed_size=False, **kwargs)
    assert unpadded_ds.element_spec[0].shape.as_list() == [None, 2]
    assert unpadded_ds.element_spec[2]["mask"].shape.as_list() == [None]
    unpadded = list(unpadded_ds)
    assert len(unpadded) == len(padded) == 50
    sizes = set()
    for (px, py, pinfo), (ux, uy, uinfo) in zip(padded, unpadded):
        count = int(tf.reduce_sum(pinfo["mask"]))
        sizes.add(count)
        assert ux.shape[0] == count and uy.shape[0] == count
        np.testing.assert_array_equal(ux.numpy(), px.numpy()[:count])
        np.testing.assert_array_equal(uy.numpy(), py.numpy()[:count])
        np.testing.assert_array_equal(uinfo["mask"].numpy(), np.ones(count, np.float32))
        assert float(uinfo["expected_batch_size"]) == pytest.approx(Q * N)
    assert len(sizes) > 3  # the sizes vary: really unpadded


@pytest.mark.parametrize("kwargs,match", [
    (dict(fixed_size=False, max_batch_size=20), "does not pad"),
    (dict(fixed_size=False, num_shards=2, shard_index=0), "several shards"),
    (dict(fixed_size="no"), "fixed_size must be True or False")])
def test_fixed_size_refuses_what_it_cannot_do(kwargs, match):
    with pytest.raises(ValueError, match=match):
        poisson_batches(*_data(), sampling_probability=Q, steps=2, **kwargs)
