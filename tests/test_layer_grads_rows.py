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
"""rows.kept_offsets_kernel against a float64 NumPy reference; the paths that use it (Conv2D's
depthwise and kept-offsets paths, the depthwise layers) are checked end to end by the
conformance tests."""

import numpy as np
import pytest

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import rows

pytestmark = pytest.mark.keras3_suite  # TF ops only: no Keras version in it


def _reference(per_row, num_microbatches, scale):
    """(‖G_m‖² [M], Σ_m c_m G_m [k, d]) with G_m = Σ_{r∈m} per_row[:, r]."""
    k, _, d = per_row.shape
    per_microbatch = per_row.astype(np.float64).reshape(k, num_microbatches, -1, d).sum(2)
    return (np.square(per_microbatch).sum((0, 2)),
            np.einsum("m,kmd->kd", scale.astype(np.float64), per_microbatch))


@pytest.mark.parametrize("rows_per_microbatch", [1, 3])
def test_kept_offsets_kernel_norms_and_clipped_sum(rows_per_microbatch):
    rng = np.random.default_rng(0)
    num_microbatches, k, d = 4, 9, 6
    per_row = rng.normal(size=[k, num_microbatches * rows_per_microbatch, d]).astype(np.float32)
    scale = rng.uniform(0.1, 1.0, size=[num_microbatches]).astype(np.float32)
    kept = rows.kept_offsets_kernel(tf.constant(per_row), num_microbatches)
    weights = clip.ClipWeights(tf.constant(scale), tf.ones([num_microbatches]))
    sq, clipped = _reference(per_row, num_microbatches, scale)
    np.testing.assert_allclose(kept.sq_norms.numpy(), sq, rtol=1e-5)
    np.testing.assert_allclose(tf.reshape(kept.materialized_sum(weights), [k, d]).numpy(),
                               clipped, rtol=1e-5, atol=1e-6)


def test_kept_offsets_kernel_rows_unknown_while_tracing():
    # Rows per microbatch unknown while tracing (a batch of unknown size): summed per step.
    rng = np.random.default_rng(1)
    per_row = rng.normal(size=[4, 6, 3]).astype(np.float32)

    @tf.function(input_signature=[tf.TensorSpec([4, None, 3], tf.float32)])
    def norms(t):
        return rows.kept_offsets_kernel(t, 2).sq_norms

    np.testing.assert_allclose(norms(tf.constant(per_row)).numpy(),
                               _reference(per_row, 2, np.ones(2, np.float32))[0], rtol=1e-5)


def test_kept_offsets_kernel_zeroes_nonfinite_microbatches_in_the_sum():
    per_row = np.ones([2, 3, 2], np.float32)
    per_row[1, 1, 0] = np.nan  # microbatch 1 (one row each)
    kept = rows.kept_offsets_kernel(tf.constant(per_row), 3)
    weights = clip.ClipWeights(tf.constant([1.0, 0.0, 0.5]), tf.constant([1.0, 0.0, 1.0]))
    np.testing.assert_array_equal(tf.reshape(kept.materialized_sum(weights), [2, 2]).numpy(),
                                  np.full([2, 2], 1.5))
