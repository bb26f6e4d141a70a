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
"""The native ops, as TF functions of tensors (no layer knowledge: the handlers decide).

Each needs :func:`~tf_tempered.privacy.native.library.load` to have returned the library;
callers ask :func:`~tf_tempered.privacy.native.library.usable` (or ``available``) first.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.native import library

__all__ = ["box_muller", "box_muller_pieces", "conv2d_clipped_kernel_sum",
           "conv2d_group_kernel_grads",
           "depthwise_kernel_grads", "embedding_sq_norms", "gru_sequence", "lstm_sequence",
           "row_sq_norms", "scatter_rows"]


def conv2d_group_kernel_grads(x, g, num_groups, *, kernel_size, strides, dilations, pads,
                              output_grads, bias_grads=False):
    """(‖G_m‖² [M], G_m as [M, kh·kw·cin·cout] or [0, ...], Σ_{e ∈ m} Σ_r g_e,r as [M, cout]
    or [0, cout]): G_m = Σ_{e ∈ m} Σ_r a_r g_rᵀ, and the bias's gradient when ``bias_grads``.

    x [B, H, W, cin] the Conv2D's input, g [B, H', W', cout] its output gradient, the M
    microbatches consecutive rows of B; a_r the input patch under output pixel r, read
    straight from x (cc/conv_kernel_grads.cc). ``pads``: (top, left) padding. Static
    spatial sizes needed (they fix the padding).
    """
    (kh, kw), size = kernel_size, kernel_size[0] * kernel_size[1] * x.shape[-1] * g.shape[-1]
    sq_norms, grads, bias = library.load().tf_tempered_conv2d_group_kernel_grads(
        tf.cast(x, g.dtype), g, tf.cast(num_groups, tf.int32), kernel_size=[kh, kw],
        strides=list(strides), dilations=list(dilations), pads=list(pads),
        output_grads=output_grads, bias_grads=bias_grads)
    return (tf.ensure_shape(sq_norms, [None]), tf.ensure_shape(grads, [None, size]),
            tf.ensure_shape(bias, [None, g.shape[-1]]))


def conv2d_clipped_kernel_sum(x, g, num_groups, other_sq_norms, l2_norm_clip, *, kernel_size,
                              strides, dilations, pads, bias_grads=False):
    """(n [M], c [M] float32, Σ_m c_m·G_m as [kh, kw, cin, cout], Σ_m c_m·b_m [cout] or None):
    a Conv2D's norms and clipped sum in one pass, given the other layers' squared norms.

    With S_m = ``other_sq_norms`` [M] (float32) and G_m, b_m the kernel's and (when
    ``bias_grads``) the bias's gradient of microbatch m (as :func:`conv2d_group_kernel_grads`):
    n_m = ‖G_m‖² + ‖b_m‖² and c_m = C / max(√(S_m + n_m), C), 0 where not finite, in
    float32 as the engine's clip factors (cc/conv_clipped_sum.cc).
    """
    kh, kw = kernel_size
    shape = [kh, kw, x.shape[-1], g.shape[-1]]
    sq_norms, scale, kernel, bias = library.load().tf_tempered_conv2d_clipped_kernel_sum(
        tf.cast(x, g.dtype), g, tf.cast(num_groups, tf.int32),
        tf.cast(other_sq_norms, tf.float32), tf.cast(l2_norm_clip, tf.float32),
        kernel_size=[kh, kw], strides=list(strides), dilations=list(dilations),
        pads=list(pads), bias_grads=bias_grads)
    return (tf.ensure_shape(sq_norms, [None]), tf.ensure_shape(scale, [None]),
            tf.reshape(kernel, shape), bias if bias_grads else None)


def depthwise_kernel_grads(x, g, *, kernel_size, strides, dilations, pads):
    """Per-example ∂ℓ_e/∂W of a depthwise convolution as [kh·kw, B, cin·dm].

    x [B, H, W, cin] its input, g [B, H', W', cin·dm] its output gradient (depth
    multiplier dm); G[i·kw + j, e, k] = Σ_r x_e[tap (i, j) of pixel r, k // dm]·g_e[r, k],
    read straight from x (cc/depthwise_kernel_grads.cc). ``pads``: (top, left) padding.
    """
    return library.load().tf_tempered_depthwise_kernel_grads(
        tf.cast(x, g.dtype), g, kernel_size=list(kernel_size), strides=list(strides),
        dilations=list(dilations), pads=list(pads))


def box_muller(key, radius_counter, angle_counter, num_pairs, stddev):
    """(r·cos θ, r·sin θ), two float32 [num_pairs] vectors: DPRandomness.box_muller, natively.

    The same Philox bits as TF's StatelessRandomUniformFullIntV2 (uint64, the radius) and
    StatelessRandomUniformV2 (float32, the angle) at these counters and key; see
    cc/box_muller.cc. For `DPRandomness.box_muller(..., pair_op=box_muller)`.
    """
    shape = tf.reshape(tf.cast(num_pairs, tf.int64), [1])
    return library.load().tf_tempered_box_muller(key, radius_counter, angle_counter, shape,
                                                 tf.cast(stddev, tf.float32))


def box_muller_pieces(key, radius_counter, angle_counter, sizes, stddev):
    """[piece_i of sizes[i] values]: :func:`box_muller`'s vector [cos half; sin half] of
    (Σ sizes + 1) // 2 pairs cut into consecutive pieces, each written straight into its own
    tensor (no halves, slices or concatenation). For ``DPRandomness.normal_pieces(...,
    pieces_op=box_muller_pieces)``.
    """
    sizes = [int(size) for size in sizes]
    return library.load().tf_tempered_box_muller_pieces(
        key, radius_counter, angle_counter, tf.constant(sizes, tf.int64),
        tf.cast(stddev, tf.float32), N=len(sizes))


def embedding_sq_norms(ids, grads):
    """[M] Σ_v ‖Σ_{p: ids_mp = v} g_mp‖² of ids [M, N] (int64) and grads [M, N, d] (float32/64).

    See cc/embedding_sq_norms.cc and layer_grads/embedding.py (the TF-ops form).
    """
    return tf.ensure_shape(library.load().tf_tempered_embedding_sq_norms(ids, grads), [None])


def scatter_rows(indices, values, num_rows):
    """[num_rows, d]: out[v] = Σ_{p: indices_p = v} values[p], tf.scatter_nd's sum bit for bit.

    indices [P] (int32/64, in [0, num_rows)), values [P, d] (float32/64); rows in parallel
    (TF's scatter_nd adds on one thread; cc/scatter_rows.cc).
    """
    return library.load().tf_tempered_scatter_rows(indices, values,
                                                   tf.cast(num_rows, tf.int64))


def row_sq_norms(x):
    """Σ_k x[r, k]² of each row of a matrix x [R, K] (float32/64): [R], one read of x and no
    [R, K] square (cc/row_sq_norms.cc); tf.reduce_sum(tf.square(x), 1) up to rounding."""
    return library.load().tf_tempered_row_sq_norms(x)


def lstm_sequence(a, u, h0, c0):
    """(h [B, T, H], c [B, T, H]) of a Keras LSTM (sigmoid gates, tanh) over its time steps.

    a [B, T, 4H] = x·W + b (gates i, f, g, o), u [H, 4H] the recurrent kernel, h0 and c0
    [B, H] the initial states, all float32 (cc/lstm_sequence.cc). Each example's recurrence
    runs in one task, examples in parallel; differentiable in a, u, h0 and c0 (the backward
    recurrence is its own op; ∂ℓ/∂U = Σ_t h_{t-1}ᵀ δa_t is a TF matmul, pruned if unused).
    """
    h, c, _ = library.load().tf_tempered_lstm_sequence(a, u, h0, c0)
    return h, c


@tf.RegisterGradient("TfTemperedLstmSequence")
def _lstm_sequence_grad(op, grad_h, grad_c, _):
    # The gates output feeds only this gradient: no gradient arrives through it.
    _, u, h0, c0 = op.inputs
    h, c, gates = op.outputs
    grad_h = tf.zeros_like(h) if grad_h is None else grad_h
    grad_c = tf.zeros_like(c) if grad_c is None else grad_c
    grad_a, grad_h0, grad_c0 = library.load().tf_tempered_lstm_sequence_grad(
        gates, c, c0, u, grad_h, grad_c)
    h_prev = tf.concat([h0[:, None], h[:, :-1]], 1)
    units = u.shape[0] if u.shape[0] is not None else tf.shape(u)[0]
    grad_u = tf.matmul(tf.reshape(h_prev, [-1, units]), tf.reshape(grad_a, [-1, 4 * units]),
                       transpose_a=True)
    return grad_a, grad_u, grad_h0, grad_c0


def gru_sequence(a, u, recurrent_bias, h0, *, reset_after=True):
    """(h [B, T, H], reset gates r [B, T, H]) of a Keras GRU (sigmoid gates, tanh) over its
    time steps; ``reset_after``: the layer's (False: r acts on h_{t-1} before U's candidate
    block).

    a [B, T, 3H] = x·W + b_in (blocks z, r, h), u [H, 3H], recurrent_bias [3H] (zeros without
    a bias, or with reset_after=False, whose one bias is in a), h0 [B, H], all float32
    (cc/gru_sequence.cc). h is differentiable in a, u, recurrent_bias and h0; r comes through
    tf.stop_gradient (a value: the recurrent kernel's rows), so the op's other outputs never
    carry a gradient.
    """
    units = u.shape[0] if u.shape[0] is not None else tf.shape(u)[0]
    h, gates, _ = library.load().tf_tempered_gru_sequence(a, u, recurrent_bias, h0,
                                                          reset_after=reset_after)
    return h, tf.stop_gradient(gates[:, :, units:2 * units])


@tf.RegisterGradient("TfTemperedGruSequence")
def _gru_sequence_grad(op, grad_h, *_):
    # Only h reaches a loss (gru_sequence stops the reset gates' gradient): the gradients of
    # the gates and recurrent_h outputs are zero (TF's zeros, pruned when unused).
    _, u, _, h0 = op.inputs
    h, gates, recurrent_h = op.outputs
    reset_after = op.get_attr("reset_after")
    grad_h = tf.zeros_like(h) if grad_h is None else grad_h
    grad_a, grad_h0 = library.load().tf_tempered_gru_sequence_grad(
        gates, recurrent_h, h, h0, u, grad_h, reset_after=reset_after)
    units = u.shape[0] if u.shape[0] is not None else tf.shape(u)[0]
    h_prev = tf.reshape(tf.concat([h0[:, None], h[:, :-1]], 1), [-1, units])
    if not reset_after:
        # U_zr's rows are h_{t-1}, U_h's r ⊙ h_{t-1} (recurrent_h); the bias joins all three
        # pre-activations: its gradient is δa's.
        grad_a_rows = tf.reshape(grad_a, [-1, 3 * units])
        grad_u = tf.concat([
            tf.matmul(h_prev, grad_a_rows[:, :2 * units], transpose_a=True),
            tf.matmul(tf.reshape(recurrent_h, [-1, units]), grad_a_rows[:, 2 * units:],
                      transpose_a=True)], 1)
        return grad_a, grad_u, tf.reduce_sum(grad_a_rows, 0), grad_h0
    # ∂ℓ/∂q_t = [δa_z, δa_r, r ⊙ δa_h]: the rows of U's and b_rec's gradients.
    grad_q = tf.concat([grad_a[:, :, :2 * units],
                        gates[:, :, units:2 * units] * grad_a[:, :, 2 * units:]], -1)
    grad_q = tf.reshape(grad_q, [-1, 3 * units])
    return (grad_a, tf.matmul(h_prev, grad_q, transpose_a=True), tf.reduce_sum(grad_q, 0),
            grad_h0)
