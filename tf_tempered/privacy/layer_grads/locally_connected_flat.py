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
"""LocallyConnected1D/2D with ``implementation=2`` or ``3``: z = x·W on the flattened input and output.

x [B, I] is the layer input flattened in its own layout, g [B, O] the gradient of the
pre-activation output flattened alike (locally_connected.py runs the layer and adds the bias).

* implementation=2: W = K ⊙ Mask as [I, O] (Mask: tf-keras' 0/1 ``kernel_mask``). Example e's
  gradient of K is (x_e g_eᵀ) ⊙ Mask, so with one example a microbatch

      ‖(x g ᵀ) ⊙ Mask‖² = Σ_{i,o} Mask_io x_i² g_o² = (x²)ᵀ Mask (g²),

  and the clipped sum is (Xᵀ(c·G)) ⊙ Mask, one matmul (book-keeping). A microbatch of several
  rows keeps its gradient (X_mᵀG_m) ⊙ Mask where M of them fit in materialize_max_bytes,
  else takes Σ_{e,e'} ((x_e ⊙ x_e')ᵀ Mask)·(g_e ⊙ g_e').
* implementation=3: K holds the weights at the index pairs (o_j, i_j) of a sparse [O, I] matrix;
  example e's gradient is x_{e,i_j} g_{e,o_j}: two gathers give it per example, summed per
  microbatch and kept (the generic VJP's memory, without its per-example passes).

>>> mask = np.array([[1.0, 0.0], [1.0, 1.0]])          # I = O = 2
>>> x, g = tf.constant([[1.0, 2.0]]), tf.constant([[3.0, 1.0]])
>>> float(masked_sq_norms(x, g, tf.constant(mask, tf.float32), 1, 1)[0])    # 1·9 + 4·9 + 4·1
49.0
"""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads import clip_weights as clip

__all__ = ["masked_sq_norms", "masked_result", "sparse_result"]


def masked_result(x, g, mask, num_microbatches, rows_per_microbatch, options):
    """(sq [M], ClipWeights → the kernel's clipped sum as [I, O], materialized?) for
    implementation=2; mask: [I, O] (the kernel mask broadcast to the kernel's shape)."""
    forced = options.forced
    size = int(np.prod(mask.shape))
    fits = (isinstance(num_microbatches, int)
            and num_microbatches * size * g.dtype.size <= options.materialize_max_bytes)
    materialize = forced == "materialize" or (forced != "ghost" and rows_per_microbatch != 1
                                              and fits)
    if materialize:
        per_microbatch = tf.reshape(
            tf.matmul(clip.group_rows(x, num_microbatches), clip.group_rows(g, num_microbatches),
                      transpose_a=True) * mask, [num_microbatches, size])
        return (clip.row_sq_norms(per_microbatch, options),
                lambda weights: clip.weighted_sum(weights.zero_nonfinite(per_microbatch),
                                                  weights.scale), True)

    def book_keeping(weights):
        xs = weights.zero_nonfinite(x, per_example=True)
        gs = weights.zero_nonfinite(g, per_example=True) * clip.per_example(weights.scale, g)
        return tf.matmul(xs, gs, transpose_a=True) * mask

    return (masked_sq_norms(x, g, mask, num_microbatches, rows_per_microbatch), book_keeping,
            False)


def masked_sq_norms(x, g, mask, num_microbatches, rows_per_microbatch=None):
    """[M] ‖(Σ_{e∈m} x_e g_eᵀ) ⊙ Mask‖² without the gradients (rows per microbatch: E if known
    while tracing, else decided per step)."""
    def one_row():
        return tf.reduce_sum(tf.matmul(tf.square(x), mask) * tf.square(g), 1)

    def pairs():
        xm, gm = clip.group_rows(x, num_microbatches), clip.group_rows(g, num_microbatches)
        x_pairs = xm[:, :, None] * xm[:, None]  # [M, E, E, I]
        g_pairs = gm[:, :, None] * gm[:, None]
        return tf.reduce_sum(tf.matmul(x_pairs, mask) * g_pairs, [1, 2, 3])

    if rows_per_microbatch is None:
        return tf.cond(tf.equal(tf.shape(x)[0], num_microbatches), one_row, pairs)
    return one_row() if rows_per_microbatch == 1 else pairs()


def sparse_result(x, g, index_pairs, num_microbatches, options):
    """(sq [M], ClipWeights → the kernel's clipped sum [nnz]) for implementation=3;
    index_pairs [nnz, 2]: (output index o_j, input index i_j) of each weight."""
    per_example = (tf.gather(g, index_pairs[:, 0], axis=1)
                   * tf.gather(x, index_pairs[:, 1], axis=1))  # [rows, nnz]
    per_microbatch = clip.sum_microbatches(per_example, num_microbatches)
    return (clip.row_sq_norms(per_microbatch, options),
            lambda weights: clip.weighted_sum(weights.zero_nonfinite(per_microbatch),
                                              weights.scale))
