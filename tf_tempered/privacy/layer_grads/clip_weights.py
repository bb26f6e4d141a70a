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
"""Per-microbatch clip factors and the small tensor helpers every handler shares.

After the norms, microbatch m's gradient is weighted by c_m = min(1, C/‖g_m‖)
(TF Privacy's clip_by_global_norm), or 0 where ‖g_m‖ is not finite. Handlers
form Σ_m c_m·g_m from a `ClipWeights`.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import native

__all__ = ["ClipWeights", "group_rows", "per_example", "row_sq_norms", "sum_microbatches",
           "weighted_sum", "widen"]

_HALF = (tf.float16, tf.bfloat16)


def widen(t):
    """``t`` in float32 if it is a float16/bfloat16 tensor (mixed precision), else ``t``.

    Per-example norms are sums of many squares: in float16 they overflow (above 65504)
    and drop examples as non-finite, so the engine computes them in float32.
    """
    if isinstance(t, tf.Tensor) and t.dtype in _HALF:
        return tf.cast(t, tf.float32)
    return t


class ClipWeights:
    """Per-microbatch clip factors: scale [M] (0 where not finite), finite [M] in {0, 1}."""

    def __init__(self, scale, finite):
        self.scale = scale
        self.finite = finite
        self.all_finite = tf.reduce_all(finite > 0)

    def zero_nonfinite(self, t, per_example=False, axis=0):
        """`t` ([M or B, ...] for axis 0) with the rows of non-finite microbatches set to zero.

        A zero clip factor does not remove NaN/inf (0·NaN = NaN), so those rows are
        zeroed; tf.cond skips the pass in the usual all-finite case. (The zero is a
        broadcast scalar: a zeros_like(t) of static shape would be folded by Grappler
        into a constant that the traced step holds for as long as it lives.)
        """
        def zeroed():
            if per_example:
                keep = _per_example(self.finite, t)  # (the argument shadows the function)
            else:
                shape = [1] * t.shape.rank
                shape[axis] = -1
                keep = tf.reshape(tf.cast(self.finite, t.dtype), shape)
            return tf.where(keep > 0, t, tf.zeros([], t.dtype))

        return tf.cond(self.all_finite, lambda: tf.identity(t), zeroed)


def row_sq_norms(rows, options=None):
    """Σ_k rows[m, k]² of each row of [M, K] (e.g. materialized per-microbatch gradients): [M].

    By the native op (one read, no [M, K] square held) where ``options.native`` allows it,
    the rows are float32/64 and native.usable() (CPU: a first build of the library only
    for BUILD_MIN_VALUES values, the saving of a small model's norms would not repay it);
    else TF's square-then-sum.

    >>> row_sq_norms(tf.constant([[3.0, 4.0], [1.0, 0.0]])).numpy().tolist()
    [25.0, 1.0]
    """
    if (options is not None and options.native and rows.dtype in (tf.float32, tf.float64)
            and rows.shape.rank == 2):
        # Counted per row when the number of rows is unknown while tracing.
        size = rows.shape.num_elements() or rows.shape[-1] or 0
        if native.usable(size):
            return native.row_sq_norms(rows)
    return tf.reduce_sum(tf.square(rows), 1)


def group_rows(t, num_microbatches):
    """[rows, ..., d] → [M, rows per microbatch, d] (rows are example-major)."""
    return tf.reshape(t, [num_microbatches, -1, t.shape[-1]])


def sum_microbatches(per_row, num_microbatches):
    """[rows, ...] → [M, ...] summed over each microbatch's rows.

    A layer's recorded rows are the batch's examples, or more rows per example
    (example-major) when a wrapper folds time into the batch (TimeDistributed
    gives its layer [B·T, ...]): per-row gradients must be summed per microbatch
    before the norm, not taken for examples of their own.
    """
    return tf.reduce_sum(tf.reshape(per_row, [num_microbatches, -1]
                                    + per_row.shape[1:].as_list()), 1)


def weighted_sum(rows, scale):
    """Σ_m scale_m · rows_m for rows [M, D]: one matrix-vector product."""
    return tf.linalg.matvec(rows, tf.cast(scale, rows.dtype), transpose_a=True)


def per_example(per_microbatch, like):
    """Repeats a [M] vector to one entry per example of `like` ([B, ...]), shaped to broadcast."""
    # (max: an empty Poisson batch has no microbatch and no example.)
    repeats = tf.shape(like)[0] // tf.maximum(tf.shape(per_microbatch)[0], 1)
    values = tf.repeat(tf.cast(per_microbatch, like.dtype), repeats)
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


_per_example = per_example
