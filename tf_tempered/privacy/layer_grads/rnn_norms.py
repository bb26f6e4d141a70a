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
"""Per-microbatch norms and clipped sums of a SimpleRNN/LSTM/GRU's kernels from its time steps.

rnn_rows.py records, per example, the inputs x_t, the states h_{t-1} entering each step
(and the GRU's reset gates r_t) and the gate gradients δa_t. Each kernel's gradient is a
sum of row outer products over the steps (rows.py's row layers), so its norm is a ghost
norm or a materialized gradient's, and its clipped sum the book-keeping one. Two shared
forms cost less than one row layer per kernel:

* SimpleRNN, LSTM: both kernels see δa_t, so z_t = [x_t, h_{t-1}]·[W; U] + b is one row layer
  of the stacked kernel: ‖∂W‖² + ‖∂U‖² by one ghost norm, whose costly Gram matrix of the
  gate gradients (T²·gates·units per example) is computed once, not once per kernel.
* GRU (reset_after=True): δa = [δa_z, δa_r, δa_h] and δr = [δa_z, δa_r, r ⊙ δa_h] share their
  z and r blocks P, so with Gram matrices K_x, K_h of the inputs and states and K_P, K_Q, K_R
  of P, Q = δa_h and R = r ⊙ δa_h,

      ‖∂W‖² + ‖∂U‖² = Σ_{t,s} (K_x + K_h)_{ts} (K_P)_{ts} + (K_x)_{ts} (K_Q)_{ts} + (K_h)_{ts} (K_R)_{ts}

  (T²·(d + 5·units) multiply-adds per example against T²·(d + 7·units) for two ghost norms).

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x, h, g = (tf.constant(rng.normal(size=s)) for s in ((2, 3, 4), (2, 3, 2), (2, 3, 6)))
>>> reset = tf.constant(rng.uniform(size=(2, 3, 2)))
>>> g_r = tf.concat([g[..., :4], reset * g[..., 4:]], -1)
>>> direct = (tf.reduce_sum(tf.square(tf.matmul(x, g, transpose_a=True)), [1, 2])
...           + tf.reduce_sum(tf.square(tf.matmul(h, g_r, transpose_a=True)), [1, 2]))
>>> np.allclose(shared_gates_sq_norms(x, h, g, reset, 2), direct)
True
"""

import dataclasses
from typing import Any

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import LayerPath, LayerResult

__all__ = ["RNNRowsPath", "recurrent_layer_result", "shared_gates_sq_norms"]


@dataclasses.dataclass(frozen=True)
class RNNRowsPath(LayerPath):
    """The rows paths of the input part (x_t, δa_t) and the recurrent part (h_{t-1}, δr_t);
    recurrent: "stacked with inputs" (SimpleRNN/LSTM) or inputs is "shared gates ghost" (GRU)."""
    inputs: Any
    recurrent: Any


def recurrent_layer_result(x, h_prev, extras, grad_a, hparams, layout):
    """The LayerResult of a recorded SimpleRNN/LSTM/GRU call (see the module docstring)."""
    recurrent_inputs, grad_r = hparams.math.recurrent_rows(h_prev, grad_a, extras)
    if hparams.math.stacks_kernels:  # SimpleRNN, LSTM: grad_r is grad_a
        return _stacked_result(x, recurrent_inputs, grad_a, hparams, layout)
    shared_ghost = hparams.math.shares_gate_blocks and _shared_ghost_chosen(
        x, h_prev, grad_a, layout)
    sq_norms = None
    if shared_ghost:
        sq_norms = shared_gates_sq_norms(x, h_prev, grad_a, extras[0], layout.num_microbatches)
    inputs_part, recurrent_part = (
        _rows_part(inputs, grad, shape, use_bias, layout,
                   kernel_sq_norms=None if sq_norms is None else part_sq)
        for inputs, grad, shape, use_bias, part_sq in (
            (x, grad_a, hparams.kernel_shape, hparams.use_bias, sq_norms),
            (recurrent_inputs, grad_r, hparams.recurrent_kernel_shape,
             hparams.use_bias and hparams.math.split_recurrent_bias,
             None if sq_norms is None else tf.zeros_like(sq_norms))))

    def clipped_sum(weights):
        kernel, *input_bias = inputs_part.clipped_sum(weights)
        recurrent, *recurrent_bias = recurrent_part.clipped_sum(weights)
        bias = ([tf.stack([input_bias[0], recurrent_bias[0]])] if recurrent_bias
                else input_bias)
        return [kernel, recurrent] + bias

    path = (RNNRowsPath("shared gates ghost", "shared gates ghost") if shared_ghost
            else RNNRowsPath(inputs_part.path, recurrent_part.path))
    return LayerResult(inputs_part.sq_norms + recurrent_part.sq_norms, clipped_sum, path)


def _rows_part(inputs, grad, kernel_shape, use_bias, layout, kernel_sq_norms=None):
    """rows.linear_norms of one kernel over the time steps' rows (inputs, grad); with
    kernel_sq_norms, those are the kernel's norms and the clipped sum is the book-keeping one."""
    options = layout.options
    src = rows.RowSource(inputs, grad, inputs.shape[-1], options)
    kernel = None
    if kernel_sq_norms is not None:
        path, kernel = rows.RowsPath(False), rows.KernelGrads(kernel_sq_norms, None)
    elif inputs.shape[1] is None:  # unknown length: the ghost norm's cost is unbounded
        path = rows.RowsPath(options.forced != "ghost" and rows.fits(src, layout.num_microbatches))
    else:
        path = rows.RowsPath(rows.choose_materialize(src, layout.num_microbatches,
                                                     layout.examples_per_microbatch))
    return rows.linear_norms(src, path, layout, kernel_shape=kernel_shape, use_bias=use_bias,
                             kernel=kernel)


def _stacked_result(x, h_prev, grad_a, hparams, layout):
    """SimpleRNN/LSTM: one row layer [x_t, h_{t-1}] of the stacked kernel [W; U]; its clipped
    sum splits back into W's and U's."""
    d_x = hparams.kernel_shape[0]
    stacked_shape = (d_x + hparams.recurrent_kernel_shape[0], hparams.kernel_shape[1])
    part = _rows_part(tf.concat([x, tf.cast(h_prev, x.dtype)], -1), grad_a, stacked_shape,
                      hparams.use_bias, layout)

    def clipped_sum(weights):
        stacked, *bias = part.clipped_sum(weights)
        return list(tf.split(stacked, [d_x, stacked_shape[0] - d_x], 0)) + bias

    return LayerResult(part.sq_norms, clipped_sum, RNNRowsPath(part.path, "stacked with inputs"))


def _shared_ghost_chosen(x, h_prev, grad_a, layout):
    """The GRU's shared-gates ghost norm if forced, or if it needs fewer multiply-adds than
    materializing both kernels (rows²·(d + 5u) per microbatch against rows·3u·(d + u)).

    Strictly fewer: at the tie (the benchmark's GRU, 64 steps of 64 inputs and 64 units) the
    ghost norm and its book-keeping sum measured slower and heavier than materializing
    (benchmarks/results/rnn_stacked_ab_keras3.md, series 1).
    """
    forced = layout.options.forced
    if forced in ("ghost", "materialize"):
        return forced == "ghost"
    if x.shape[1] is None or layout.examples_per_microbatch is None:
        return False  # rows unknown while tracing: the ghost norm's cost is unbounded
    num_rows = rows.static_rows(grad_a, layout.examples_per_microbatch)
    if num_rows is None:
        return False
    d, units = x.shape[-1], h_prev.shape[-1]
    return num_rows * (d + 5 * units) < 3 * units * (d + units)


def shared_gates_sq_norms(x, h_prev, grad_a, reset, num_microbatches):
    """‖∂W‖² + ‖∂U‖² per microbatch of a GRU with reset_after=True (module docstring)."""
    units = h_prev.shape[-1]

    def gram(t):
        grouped = clip.group_rows(t, num_microbatches)
        return tf.matmul(grouped, grouped, transpose_b=True)

    g_h = grad_a[..., 2 * units:]
    k_x, k_h = gram(x), gram(tf.cast(h_prev, x.dtype))
    total = (k_x + k_h) * gram(grad_a[..., :2 * units]) + k_x * gram(g_h) + k_h * gram(reset * g_h)
    return tf.reduce_sum(total, [1, 2])
