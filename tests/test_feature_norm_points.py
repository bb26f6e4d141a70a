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
"""--feature_norm=dp_stats releases from two points per example what it would from all features."""

import numpy as np

from tf_tempered import feature_stats
from tf_tempered.experiments import common, feature_norm


def test_moment_points_keep_each_examples_moments_and_the_release():
    x = np.random.default_rng(0).gamma(0.5, 0.2, (37, 3, 3, 5)).astype(np.float32)
    x[3] = 0.0  # an example of zeros: zero spread
    m, s = feature_stats.channel_moments(x)
    points = feature_norm.moment_points(x, chunk=8)  # chunks of 8: the last one short
    assert points.shape == (37, 2, 5) and points.dtype == np.float64
    m2, s2 = feature_stats.channel_moments(points)
    np.testing.assert_allclose(m2, m, rtol=1e-13, atol=1e-16)
    np.testing.assert_allclose(s2, s, rtol=1e-13, atol=1e-16)
    direct = feature_stats.dp_channel_stats(x, noise_multiplier=2.0, insecure_dp_seed=5)
    config = common.TrainConfig(features="scatternet", feature_norm="dp_stats",
                                feature_norm_noise=2.0, insecure_dp_seed=5)
    released = feature_norm.release(config, x)
    np.testing.assert_allclose(released.mean, direct.mean, rtol=1e-6)
    np.testing.assert_allclose(released.variance, direct.variance, rtol=1e-6)
