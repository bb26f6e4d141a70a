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
"""Tests for tf_tempered.privacy.poisson_draws: one step's sizes and members."""

import numpy as np
import pytest
from scipy import stats

from tf_tempered._compat import tf
from tf_tempered.privacy import poisson_draws

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

FALSE_ALARM = 1e-6


def test_default_max_batch_size_is_minimal():
    for n, q, steps in [(60000, 256 / 60000, 14040), (40, 0.2, 3000), (100, 0.9, 10)]:
        k = poisson_draws.default_max_batch_size(num_examples=n, sampling_probability=q,
                                                 total_steps=steps)
        assert steps * stats.binom.sf(k, n, q) < 1e-10
        assert k == n or steps * stats.binom.sf(k - 1, n, q) >= 1e-10
    assert poisson_draws.default_max_batch_size(num_examples=5, sampling_probability=1.0,
                                                total_steps=3) == 5


def test_bernoulli_members_gaps_are_geometric():
    # The sampler's transform: from m uniforms, members whose gaps are Geometric(q) on
    # {0, 1, ...}, i.e. a Bernoulli(q) draw per example (fixed NumPy uniforms: this tests
    # the transform, not the secret key).
    q, m = 0.3, 200_000
    uniform = np.random.default_rng(0).random(m)
    members = poisson_draws.bernoulli_members(tf.constant(uniform), num_examples=10 ** 9,
                                              sampling_probability=q).numpy()
    assert len(members) == m and np.all(np.diff(members) >= 1)
    gaps = np.diff(np.concatenate([[-1], members])) - 1
    observed = np.bincount(np.minimum(gaps, 15), minlength=16)
    expected = m * np.append(stats.geom.pmf(np.arange(1, 16), q), stats.geom.sf(15, q))
    _, p_value = stats.chisquare(observed, expected)
    assert p_value > FALSE_ALARM
    # Only members below N are returned, and q = 1 takes every example.
    every = poisson_draws.bernoulli_members(tf.constant(uniform[:50]), num_examples=7,
                                            sampling_probability=1.0)
    assert every.numpy().tolist() == list(range(7))
    assert np.all(poisson_draws.bernoulli_members(tf.constant(uniform), num_examples=1000,
                                                  sampling_probability=q).numpy() < 1000)
