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
"""Per-microbatch norms and clipped sums of a layer whose gradient is a sum of row outer products.

Dense, Conv2D and EinsumDense layers compute Z = A·W (+ b) row by row: with
G = ∂(Σ_m ℓ_m)/∂Z from the one backward pass, the gradient of microbatch m is

    ∂ℓ_m/∂W = Σ_{r ∈ rows(m)} a_r g_rᵀ

(rows: the examples of m × any sequence positions or output pixels; a_r is the
input patch of pixel r for a Conv2D). Its squared norm comes from

* materialization: the d_in×d_out matrix of every microbatch (a batched
  matmul); the norm and the clipped sum Σ_m c_m·g_m (a matrix-vector product)
  are then cheap, and nothing heavy waits for the clip factors; or
* the ghost norm: ‖Σ_r a_r g_rᵀ‖² = Σ_{r,s} (a_r·a_s)(g_r·g_s), cost ∝
  R²(d_in + d_out), when materializing would cost more (few rows) or take more
  memory than EngineOptions.materialize_max_bytes. The clipped sum is then
  Σ_r a_r (c_{m(r)} g_r)ᵀ: the usual weight-gradient product with rescaled
  output gradients ("book-keeping"; no second backward pass).

A handler describes its rows with a `RowSource` and may bring kernel norms of
its own (the native Conv2D op, the depthwise backprop): `linear_norms` then
adds the bias and the clipped sums. Which of the two paths a layer takes
(`choose_materialize`, `fits`, `RowsPath`) is decided in rows_path.py, whose names
this module re-exports.
"""

import dataclasses
import functools
from typing import Any, Callable

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import conv_grads
from tf_tempered.privacy.layer_grads.contract import LayerResult
# Re-exported: the handlers use them as rows.RowSource, rows.choose_materialize, ...
from tf_tempered.privacy.layer_grads.rows_path import (ALWAYS_MATERIALIZE_BYTES,
                                                       MAX_MEMORY_SLACK, RowSource, RowsPath,
                                                       choose_materialize, fits, static_rows)

__all__ = ["ALWAYS_MATERIALIZE_BYTES", "KernelGrads", "MAX_MEMORY_SLACK", "RowSource", "RowsPath",
           "choose_materialize", "fits", "kept_offsets_kernel", "linear_norms", "static_rows"]


@dataclasses.dataclass(frozen=True, eq=False)
class KernelGrads:
    """Kernel norms a handler computed itself: sq [M], and a ClipWeights →
    Σ_m c_m·G_m function for when its per-microbatch gradients are kept."""
    sq_norms: Any
    materialized_sum: Callable[[Any], Any]


def kept_offsets_kernel(per_row, num_microbatches):
    """KernelGrads of per-row kernel gradients [k, rows, d] (k kernel offsets; the depthwise
    backprop's layout), kept for a matrix-vector clipped sum.

    G_m = Σ_{r∈m} G_r (an example may have several rows: TimeDistributed gives its layer
    [B·T, ...]); ‖G_m‖² = Σ_o (Σ_j G_m[o, j]²) summed over the offsets o first, a column sum:
    TF's CPU reduction over axes [0, 2] at once took 3-5x longer for the MNIST CNN's conv1
    ([64, 256, 16]: 0.55 against 0.10-0.19 ms; benchmarks/results/kept_offsets_norms.md).

    >>> per_row = tf.reshape(tf.range(24.0), [2, 4, 3])  # 2 offsets, 4 rows, 2 microbatches
    >>> kept = kept_offsets_kernel(per_row, 2)
    >>> kept.sq_norms.numpy().tolist()  # ‖rows 2m + 2m+1‖², both offsets: 83 + 2531, 875 + 5051
    [2614.0, 5926.0]
    """
    k, d = per_row.shape[0], per_row.shape[-1]
    grouped = tf.reshape(per_row, [k, num_microbatches, -1, d])
    if grouped.shape[2] == 1:
        per_microbatch = tf.reshape(grouped, [k, num_microbatches, d])  # no pass over the data
    else:
        per_microbatch = tf.reduce_sum(grouped, 2)

    def materialized_sum(weights):  # Σ_m c_m G_m as [k, 1, d]
        kept = weights.zero_nonfinite(per_microbatch, axis=1)
        return tf.matmul(tf.cast(weights.scale, kept.dtype)[None, None, :], kept)

    sq_norms = tf.reduce_sum(tf.reduce_sum(tf.square(per_microbatch), 0), 1)
    return KernelGrads(sq_norms, materialized_sum)


def _input_rows(src, x, num_microbatches):
    """A for examples x, grouped as [microbatches, rows, d_in]."""
    return clip.group_rows(tf.cast(src.to_rows(x), src.grad_output.dtype), num_microbatches)


def _materialized_kernel_grads(src, x, g, num_microbatches):
    a, g = _input_rows(src, x, num_microbatches), clip.group_rows(g, num_microbatches)
    return tf.reshape(tf.matmul(a, g, transpose_a=True), [-1, a.shape[-1] * g.shape[-1]])


def _ghost_sq_norms(src, x, g, num_microbatches, with_bias=False):
    """Σ_{r,s} (a_r·a_s + [bias])(g_r·g_s) per microbatch: kernel (and bias) squared norms."""
    a, g = _input_rows(src, x, num_microbatches), clip.group_rows(g, num_microbatches)
    ones = 1.0 if with_bias else 0.0
    if a.shape[1] == 1:
        return (tf.reduce_sum(tf.square(a), [1, 2]) + ones) * tf.reduce_sum(tf.square(g), [1, 2])
    a_gram = tf.matmul(a, a, transpose_b=True)
    if with_bias:
        a_gram += 1.0
    return tf.reduce_sum(a_gram * tf.matmul(g, g, transpose_b=True), [1, 2])


def _over_chunks(fn, src, num_microbatches, examples_per_microbatch):
    """fn(src, x, g, microbatches) over the batch, in consecutive chunks where patches are large.

    Chunks hold whole microbatches. A layer's rows (images) are the batch's
    examples, or several per example (TimeDistributed gives its layer
    [B·T, ...], example-major), so a microbatch has rows / M of them.
    """
    x, g = src.inputs, src.grad_output
    rows = x.shape[0]
    chunk_bytes = src.options.patch_chunk_bytes  # patches of a whole batch never at once
    middle = g.shape[1:-1]
    if not middle.is_fully_defined():  # (a sequence of a length unknown while tracing)
        return fn(src, x, g, num_microbatches)
    per_row = int(np.prod(middle.as_list(), dtype=np.int64)) * src.d_in * g.dtype.size
    if (not src.chunked or examples_per_microbatch is None
            or (rows is not None and rows * per_row <= chunk_bytes)):
        return fn(src, x, g, num_microbatches)
    if rows is None or not isinstance(num_microbatches, int):
        # Then one example per microbatch (a static count would fix the batch);
        # chunks count microbatches of one row (more rows per example: larger chunks).
        layout = max(1, chunk_bytes // per_row)
        return tf.cond(tf.shape(x)[0] * per_row <= chunk_bytes,
                       lambda: fn(src, x, g, num_microbatches),
                       lambda: _over_padded_chunks(fn, src, num_microbatches, layout))
    rows_per_microbatch = rows // num_microbatches
    layout = max(1, chunk_bytes // (per_row * rows_per_microbatch)) * rows_per_microbatch
    outputs = []
    for start in range(0, rows, layout):
        # Each chunk starts once the previous one is done, so its patches are freed.
        with tf.control_dependencies(outputs[-1:]):
            x_chunk = tf.identity(x[start:start + layout])
        outputs.append(fn(src, x_chunk, g[start:start + layout],
                          x_chunk.shape[0] // rows_per_microbatch))
    return tf.concat(outputs, 0)


def _over_padded_chunks(fn, src, num_microbatches, layout):
    """fn over zero-padded chunks of `step` microbatches, one after the other."""
    x, g = src.inputs, src.grad_output

    def by_microbatch(t):  # [rows, ...] → [M, rows per microbatch, ...]
        return tf.reshape(t, [num_microbatches, -1] + t.shape[1:].as_list())

    def merged(t, like):  # [step, rows per microbatch, ...] → [rows, ...], static sizes kept
        return tf.reshape(t, [-1] + like.shape[1:].as_list())

    out = conv_grads.map_padded_chunks(
        lambda xc, gc: fn(src, merged(xc, x), merged(gc, g), layout),
        by_microbatch(x), by_microbatch(g), layout, parallel_iterations=1)
    return tf.reshape(out, [-1] + out.shape[2:].as_list())[:num_microbatches]


def _sq_row_norms(rows):
    return tf.reduce_sum(tf.square(rows), 1)


def row_book_keeping(src, weights):
    """(Σ_r a_r (c_{m(r)} g_r)ᵀ, the rescaled c·g as [M, rows, d_out]) from the rows themselves."""
    num_microbatches = tf.shape(weights.scale)[0]
    a = weights.zero_nonfinite(_input_rows(src, src.inputs, num_microbatches))
    g = weights.zero_nonfinite(clip.group_rows(src.grad_output, num_microbatches))
    g *= tf.cast(weights.scale, g.dtype)[:, None, None]
    return tf.matmul(tf.reshape(a, [-1, a.shape[-1]]), tf.reshape(g, [-1, g.shape[-1]]),
                     transpose_a=True), g


def linear_norms(src, path, layout, *, kernel_shape, use_bias, book_keeping=None,
                 kernel=None, bias_per_microbatch=None, bias_from_scaled=None):
    """Norms of a row layer's [kernel, bias] (bias only if use_bias).

    path.materialize chooses ghost norm / materialized gradients (see RowsPath).
    kernel: a KernelGrads the handler computed itself (native op, depthwise),
      else the kernel's norms come from the rows.
    book_keeping: ClipWeights → (Σ_r a_r (c·g_r)ᵀ, rescaled g); the rows' own
      matmul by default (a Conv2D uses TF's backprop-filter op instead).
    bias_per_microbatch: M → [M, bias size] (default: G summed over each
      microbatch's rows); bias_from_scaled: rescaled g → the bias's clipped
      sum (default: its sum over rows). Without a default (bias_from_scaled
      None and bias_per_microbatch given) the bias never joins the ghost norm
      as a column of ones.
    """
    materialize = path.materialize
    g = src.grad_output
    if book_keeping is None:
        book_keeping = functools.partial(row_book_keeping, src)
    ones_column = bias_per_microbatch is None
    if bias_per_microbatch is None:
        bias_per_microbatch = lambda m: tf.reduce_sum(clip.group_rows(g, m), 1)
    if bias_from_scaled is None:
        bias_from_scaled = lambda scaled: tf.reduce_sum(
            tf.reshape(scaled, [-1, scaled.shape[-1]]), 0)
    # A ghost norm takes the bias in as an input column of ones, and its clipped
    # sum comes out of the book-keeping; otherwise per-microbatch bias gradients:
    # the sum over each microbatch's rows, however many rows an example has (a
    # static count of one per example does not make it one per microbatch).
    separate_bias = use_bias and (materialize is not False or kernel is not None
                                  or not ones_column)
    bias = bias_per_microbatch(layout.num_microbatches) if separate_bias else None
    sq, materialized_sum = _kernel_sq_norms(src, materialize, kernel, layout,
                                            with_bias=use_bias and not separate_bias)
    if bias is not None:
        sq += _sq_row_norms(bias)

    def clipped_sum(weights):
        bias_grad = None
        if materialize is False:
            kernel_grad, scaled_g = book_keeping(weights)
            # The bias's per-microbatch gradients, where the norms needed them, give its
            # sum by one [M]·[M, d] product instead of a pass over every row of c·g
            # (MNIST CNN: 1.5-4 against 40-100 µs; benchmarks/results/step_small_ops.md).
            if use_bias and ones_column and bias is None:
                bias_grad = bias_from_scaled(scaled_g)
        elif materialize is True:
            kernel_grad = materialized_sum(weights)
        else:
            kernel_grad = tf.cond(materialize, lambda: materialized_sum(weights),
                                  lambda: tf.reshape(book_keeping(weights)[0], [-1]))
        if use_bias and bias_grad is None:
            bias_grad = clip.weighted_sum(weights.zero_nonfinite(bias), weights.scale)
        grads = [tf.reshape(kernel_grad, kernel_shape)]
        return grads + [bias_grad] if use_bias else grads

    return LayerResult(sq, clipped_sum, path)


def _kept_sum(per_microbatch):
    """ClipWeights → Σ_m c_m·g_m of materialized per-microbatch gradients (non-finite rows 0)."""
    return lambda weights: clip.weighted_sum(weights.zero_nonfinite(per_microbatch),
                                             weights.scale)


def _kernel_sq_norms(src, materialize, kernel, layout, *, with_bias):
    """(‖g_m‖² of the kernel [M] (+ the bias as a ones column if with_bias), the materialized
    clipped sum or None): from `kernel` if the handler computed it, else ghost norms
    (materialize False), materialized gradients (True), or either chosen per step (a tensor)."""
    num_microbatches, examples = layout.num_microbatches, layout.examples_per_microbatch
    if kernel is not None:
        return kernel.sq_norms, kernel.materialized_sum
    if materialize is True:
        per_microbatch = _over_chunks(_materialized_kernel_grads, src, num_microbatches,
                                      examples)
        return clip.row_sq_norms(per_microbatch, src.options), _kept_sum(per_microbatch)
    if materialize is False:
        return _over_chunks(functools.partial(_ghost_sq_norms, with_bias=with_bias),
                            src, num_microbatches, examples), None

    def materialized():
        per_microbatch = _over_chunks(_materialized_kernel_grads, src, num_microbatches,
                                      examples)
        return clip.row_sq_norms(per_microbatch, src.options), per_microbatch

    def ghost():  # an empty stand-in keeps both branches' outputs alike
        return (_over_chunks(_ghost_sq_norms, src, num_microbatches, examples),
                tf.zeros([0, src.d_in * src.grad_output.shape[-1]], src.grad_output.dtype))

    sq, per_microbatch = tf.cond(materialize, materialized, ghost)
    return sq, _kept_sum(per_microbatch)
