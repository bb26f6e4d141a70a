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
"""Clip weights of the DP engine; its per-layer paths are checked end to end in test_engine."""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads import clip_weights as clip


def test_clip_weights_zero_only_nonfinite_rows():
    rows = tf.constant([[1.0, np.nan], [2.0, 3.0], [np.inf, 1.0]])
    finite = tf.constant([0.0, 1.0, 0.0])
    np.testing.assert_array_equal(
        clip.ClipWeights(tf.constant([0.0, 0.5, 0.0]), finite).zero_nonfinite(rows).numpy(),
        [[0, 0], [2, 3], [0, 0]])
    all_finite = clip.ClipWeights(tf.ones(3), tf.ones(3))
    np.testing.assert_array_equal(all_finite.zero_nonfinite(tf.ones([3, 2])).numpy(), np.ones([3, 2]))
    # Per-example rows of microbatches of two examples.
    per_example = clip.ClipWeights(tf.ones(2), tf.constant([1.0, 0.0])).zero_nonfinite(
        tf.fill([4, 1], np.nan), per_example=True)
    assert np.isnan(per_example.numpy()[:2]).all() and (per_example.numpy()[2:] == 0).all()
