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
"""Per-microbatch gradient norms and clipped gradient sums from ONE backward pass.

DP-SGD needs, for every microbatch m, the L2 norm of its gradient g_m over all
trainable variables, and then Σ_m c_m·g_m with c_m = min(1, C/‖g_m‖). Stock TF
Privacy gets g_m by back-propagating once per microbatch. Here the forward pass
records, for each layer with trainable weights, its input A and its output Z
(pre-activation for Dense/Conv2D); one backward pass gives G = ∂(Σ_m ℓ_m)/∂Z,
whose rows are the per-example output gradients because examples do not mix.
A layer's weight gradient is then a sum of per-row outer products,

    ∂ℓ_m/∂W = Σ_{r ∈ rows(m)} a_r g_rᵀ,

(Dense rows: examples of the microbatch × any sequence positions; Conv2D rows: the
same × output pixels, with a_r the input patch of pixel r). Its squared norm is
computed per layer in one of three ways:

* the native op (Conv2D on CPU, see native.py): G_m and ‖G_m‖² straight from the
  image, no patch tensor; with many output pixels G_m is kept for a matrix-vector
  clipped sum, else only the norms (the clipped sum then by book-keeping, below);
* materialization: form the d_in×d_out matrix of every microbatch (a batched
  matmul; for Conv2D with few channels, one depthwise-conv backprop); the norm
  and the clipped sum Σ_m c_m·g_m (a matrix-vector product) are then cheap, and
  nothing heavy waits for the clip factors;
* ghost norm: ‖Σ_r a_r g_rᵀ‖² = Σ_{r,s} (a_r·a_s)(g_r·g_s), cost ∝ R²(d_in + d_out),
  when materializing would cost more (few rows, e.g. a Dense layer) or take
  more memory than strategy.py allows. The clipped sum is then
  Σ_r a_r (c_{m(r)} g_r)ᵀ: the usual weight-gradient product with rescaled output
  gradients ("book-keeping"; no second backward pass).

Other trainable layers (learnable TemperedSigmoid, LayerNormalization, Embedding,
...) get per-example gradients of their own weights from a vectorized VJP of that
layer alone, which is cheap because it does not go through the rest of the net.
"""

import functools

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import conv_grads
from tf_tempered.privacy import native
from tf_tempered.privacy import strategy
from tf_tempered.privacy.recording import own_trainable_weights

__all__ = ["ClipWeights", "layer_sq_norms", "layer_clipped_grads"]


# ---------------------------------------------------------------------------
# Per-layer norms and clipped sums. M is the number of microbatches, E the
# examples per microbatch (None when the batch size is not static). Which path a
# Dense/Conv2D layer takes is strategy.py's choice.

class ClipWeights:
    """Per-microbatch clip factors: scale [M] (0 where not finite), finite [M] in {0, 1}."""

    def __init__(self, scale, finite):
        self.scale = scale
        self.finite = finite
        self.all_finite = tf.reduce_all(finite > 0)

    def zero_nonfinite(self, t, per_example=False, axis=0):
        """`t` ([M or B, ...] for axis 0) with the rows of non-finite microbatches set to zero.

        A zero clip factor does not remove NaN/inf (0·NaN = NaN), so those rows are
        zeroed; tf.cond skips the pass in the usual all-finite case.
        """
        def zeroed():
            if per_example:
                keep = _per_example(self.finite, t)
            else:
                shape = [1] * t.shape.rank
                shape[axis] = -1
                keep = tf.reshape(tf.cast(self.finite, t.dtype), shape)
            return tf.where(keep > 0, t, tf.zeros_like(t))

        return tf.cond(self.all_finite, lambda: tf.identity(t), zeroed)


def _group_rows(t, num_microbatches):
    return tf.reshape(t, [num_microbatches, -1, t.shape[-1]])


def _sum_microbatches(per_row, num_microbatches):
    """[rows, ...] → [M, ...] summed over each microbatch's rows.

    A layer's recorded rows are the batch's examples, or more rows per example
    (example-major) when a wrapper folds time into the batch (TimeDistributed
    gives its layer [B·T, ...]): per-row gradients must be summed per microbatch
    before the norm, not taken for examples of their own.
    """
    return tf.reduce_sum(tf.reshape(per_row, [num_microbatches, -1]
                                    + per_row.shape[1:].as_list()), 1)


# Larger batches of a Conv2D's input patches are made and used in consecutive
# chunks of examples, so the patches of the whole batch (kh·kw times the input)
# never exist at once.
_PATCH_CHUNK_BYTES = 32 * 2**20


def _prepare_linear(record, num_microbatches, examples_per_microbatch):
    """Chooses a Dense/Conv2D layer's path (strategy.choose) and fills record.cache."""
    layer, g = record.layer, record.grad_output
    cache = record.cache
    strategy.choose(record, num_microbatches, examples_per_microbatch)
    if cache["depthwise"]:
        per_row = conv_grads.per_example_kernel_grads(  # [kh·kw, rows, cin·cout]
            layer, record.inputs, record.grad_output)
        # Summed per microbatch even with one example each: an example may have
        # several rows (TimeDistributed gives its layer [B·T, ...]).
        cache["per_microbatch_middle"] = tf.reduce_sum(tf.reshape(
            per_row, [per_row.shape[0], num_microbatches, -1, per_row.shape[-1]]), 2)
    # A ghost norm takes the bias in as an input column of ones, and its clipped
    # sum comes out of the book-keeping; otherwise per-microbatch bias gradients:
    # the sum over each microbatch's rows, however many rows an example has (a
    # static count of one per example does not make it one per microbatch).
    if layer.use_bias and (cache["materialize"] is not False or cache["native"]):
        cache["bias"] = tf.reduce_sum(_group_rows(g, num_microbatches), 1)


def _input_rows(record, x, num_microbatches):
    """A of the docstring for examples x, grouped as [microbatches, rows, d_in]."""
    a = conv_grads.patches(record.layer, x) if record.kind == "conv2d" else x
    return _group_rows(tf.cast(a, record.grad_output.dtype), num_microbatches)


def _materialized_kernel_grads(record, x, g, num_microbatches):
    a, g = _input_rows(record, x, num_microbatches), _group_rows(g, num_microbatches)
    return tf.reshape(tf.matmul(a, g, transpose_a=True), [-1, a.shape[-1] * g.shape[-1]])


def _ghost_sq_norms(record, x, g, num_microbatches, with_bias=False):
    """Σ_{r,s} (a_r·a_s + [bias])(g_r·g_s) per microbatch: kernel (and bias) squared norms."""
    a, g = _input_rows(record, x, num_microbatches), _group_rows(g, num_microbatches)
    ones = 1.0 if with_bias else 0.0
    if a.shape[1] == 1:
        return (tf.reduce_sum(tf.square(a), [1, 2]) + ones) * tf.reduce_sum(tf.square(g), [1, 2])
    a_gram = tf.matmul(a, a, transpose_b=True)
    if with_bias:
        a_gram += 1.0
    return tf.reduce_sum(a_gram * tf.matmul(g, g, transpose_b=True), [1, 2])


def _over_chunks(fn, record, num_microbatches, examples_per_microbatch):
    """fn(record, x, g, microbatches) over the batch, in consecutive chunks where patches are large.

    Chunks hold whole microbatches. A layer's rows (images) are the batch's
    examples, or several per example (TimeDistributed gives its layer
    [B·T, ...], example-major), so a microbatch has rows / M of them.
    """
    x, g = record.inputs, record.grad_output
    rows = x.shape[0]
    per_row = int(np.prod(g.shape[1:-1])) * strategy.input_width(record) * g.dtype.size
    if (record.kind != "conv2d" or examples_per_microbatch is None
            or (rows is not None and rows * per_row <= _PATCH_CHUNK_BYTES)):
        return fn(record, x, g, num_microbatches)
    if rows is None or not isinstance(num_microbatches, int):
        # Then one example per microbatch (a static count would fix the batch);
        # chunks count microbatches of one row (more rows per example: larger chunks).
        step = max(1, _PATCH_CHUNK_BYTES // per_row)
        return tf.cond(tf.shape(x)[0] * per_row <= _PATCH_CHUNK_BYTES,
                       lambda: fn(record, x, g, num_microbatches),
                       lambda: _over_padded_chunks(fn, record, num_microbatches, step))
    rows_per_microbatch = rows // num_microbatches
    step = max(1, _PATCH_CHUNK_BYTES // (per_row * rows_per_microbatch)) * rows_per_microbatch
    outputs = []
    for start in range(0, rows, step):
        # Each chunk starts once the previous one is done, so its patches are freed.
        with tf.control_dependencies(outputs[-1:]):
            x_chunk = tf.identity(x[start:start + step])
        outputs.append(fn(record, x_chunk, g[start:start + step],
                          x_chunk.shape[0] // rows_per_microbatch))
    return tf.concat(outputs, 0)


def _over_padded_chunks(fn, record, num_microbatches, step):
    """fn over zero-padded chunks of `step` microbatches, one after the other."""
    x, g = record.inputs, record.grad_output

    def by_microbatch(t):  # [rows, ...] → [M, rows per microbatch, ...]
        return tf.reshape(t, [num_microbatches, -1] + t.shape[1:].as_list())

    def merged(t, like):  # [step, rows per microbatch, ...] → [rows, ...], static sizes kept
        return tf.reshape(t, [-1] + like.shape[1:].as_list())

    out = conv_grads.map_padded_chunks(
        lambda xc, gc: fn(record, merged(xc, x), merged(gc, g), step),
        by_microbatch(x), by_microbatch(g), step, parallel_iterations=1)
    return tf.reshape(out, [-1] + out.shape[2:].as_list())[:num_microbatches]


def _sq_row_norms(rows):
    return tf.reduce_sum(tf.square(rows), 1)


def layer_sq_norms(record, num_microbatches, examples_per_microbatch):
    """Squared L2 norm of each microbatch's gradient of this layer's own weights: [M]."""
    if record.kind == "generic":
        per_example = _generic_per_example_grads(record)
        grouped = [_sum_microbatches(p, num_microbatches) for p in per_example]
        record.cache["per_microbatch"] = grouped
        return tf.add_n([_sq_row_norms(tf.reshape(p, [num_microbatches, -1])) for p in grouped])
    _prepare_linear(record, num_microbatches, examples_per_microbatch)
    cache = record.cache
    materialize = cache["materialize"]
    if cache["native"]:
        def native_grads(output_grads):
            return native.conv2d_kernel_grads(record.layer, record.inputs, record.grad_output,
                                              num_microbatches, output_grads)

        if isinstance(materialize, bool):
            sq, per_microbatch = native_grads(materialize)
        else:
            sq, per_microbatch = tf.cond(materialize, lambda: native_grads(True),
                                         lambda: native_grads(False))
        if materialize is not False:
            cache["per_microbatch"] = per_microbatch
    elif "per_microbatch_middle" in cache:
        sq = tf.reduce_sum(tf.square(cache["per_microbatch_middle"]), [0, 2])
    elif isinstance(materialize, bool):
        if materialize:
            cache["per_microbatch"] = _over_chunks(_materialized_kernel_grads, record,
                                                   num_microbatches, examples_per_microbatch)
            sq = _sq_row_norms(cache["per_microbatch"])
        else:
            sq = _over_chunks(functools.partial(_ghost_sq_norms, with_bias=record.layer.use_bias),
                              record, num_microbatches, examples_per_microbatch)
    else:
        g = record.grad_output

        def materialized():
            per_microbatch = _over_chunks(_materialized_kernel_grads, record,
                                          num_microbatches, examples_per_microbatch)
            return _sq_row_norms(per_microbatch), per_microbatch

        def ghost():  # an empty stand-in keeps both branches' outputs alike
            return (_over_chunks(_ghost_sq_norms, record, num_microbatches, examples_per_microbatch),
                    tf.zeros([0, strategy.input_width(record) * g.shape[-1]], g.dtype))

        sq, cache["per_microbatch"] = tf.cond(materialize, materialized, ghost)
    if "bias" in cache:
        sq += _sq_row_norms(cache["bias"])
    return sq


def layer_clipped_grads(record, weights):
    """Σ_m scale_m · (gradient of microbatch m) for each of the layer's own weights.

    `weights` is a ClipWeights; microbatches whose gradient is not finite add
    nothing. Returns {variable ref: gradient}.
    """
    layer, cache = record.layer, record.cache
    if record.kind == "generic":
        grads = {}
        for var, p in zip(own_trainable_weights(layer), cache["per_microbatch"]):
            flat = weights.zero_nonfinite(tf.reshape(p, [tf.shape(p)[0], -1]))
            grads[var.ref()] = tf.reshape(_weighted_sum(flat, weights.scale), var.shape)
        return grads

    def materialized():
        if "per_microbatch_middle" in cache:  # [kh·kw, M, cin·cout]
            rows = weights.zero_nonfinite(cache["per_microbatch_middle"], axis=1)
            return tf.matmul(tf.cast(weights.scale, rows.dtype)[None, None, :], rows)
        return _weighted_sum(weights.zero_nonfinite(cache["per_microbatch"]), weights.scale)

    materialize = cache["materialize"]
    if materialize is False:
        kernel_grad, scaled_g = _book_keeping(record, weights)
        bias_grad = tf.reduce_sum(tf.reshape(scaled_g, [-1, scaled_g.shape[-1]]), 0)
    elif materialize is True:
        kernel_grad = materialized()
    else:
        kernel_grad = tf.cond(materialize, materialized,
                              lambda: tf.reshape(_book_keeping(record, weights)[0], [-1]))
    if materialize is not False and layer.use_bias:
        bias_grad = _weighted_sum(weights.zero_nonfinite(cache["bias"]), weights.scale)
    grads = {layer.kernel.ref(): tf.reshape(kernel_grad, layer.kernel.shape)}
    if layer.use_bias:
        grads[layer.bias.ref()] = bias_grad
    return grads


def _book_keeping(record, weights):
    """(Σ_r a_r (c_{m(r)} g_r)ᵀ, the rescaled c·g): the batch's ordinary weight
    gradient with the output gradients rescaled; the bias gradient is Σ_r c·g_r."""
    if record.kind == "conv2d":
        # For a convolution that product is TF's own conv backprop-filter op.
        layer = record.layer
        g = weights.zero_nonfinite(record.grad_output, per_example=True)
        g *= _per_example(weights.scale, g)
        x = weights.zero_nonfinite(tf.cast(record.inputs, g.dtype), per_example=True)
        if tuple(layer.dilation_rate) != (1, 1):
            return _dilated_filter_grad(layer, x, g), g
        return tf.compat.v1.nn.conv2d_backprop_filter(
            x, tf.constant(layer.kernel.shape.as_list()), g, strides=[1, *layer.strides, 1],
            padding=layer.padding.upper(), dilations=[1, *layer.dilation_rate, 1]), g
    num_microbatches = tf.shape(weights.scale)[0]
    a = weights.zero_nonfinite(_input_rows(record, record.inputs, num_microbatches))
    g = weights.zero_nonfinite(_group_rows(record.grad_output, num_microbatches))
    g *= tf.cast(weights.scale, g.dtype)[:, None, None]
    return tf.matmul(tf.reshape(a, [-1, a.shape[-1]]), tf.reshape(g, [-1, g.shape[-1]]),
                     transpose_a=True), g


def _dilated_filter_grad(layer, x, g):
    """Σ_r a_r g_rᵀ of a dilated Conv2D: the gradient of the layer's own convolution.

    TF's CPU backprop-filter kernel refuses dilations (float64 always; float32
    without oneDNN), while the layer's own convolution (tf.nn.convolution, which
    dilates by space-to-batch where the kernel cannot) back-propagates wherever
    the layer trains. Its forward output is not needed by the gradient (graph
    pruning can drop it).
    """
    kernel = tf.cast(tf.convert_to_tensor(layer.kernel), g.dtype)
    with tf.GradientTape() as tape:
        tape.watch(kernel)
        z = layer.convolution_op(x, kernel)
    return tape.gradient(z, kernel, output_gradients=g)


def _weighted_sum(rows, scale):
    """Σ_m scale_m · rows_m for rows [M, D]: one matrix-vector product."""
    return tf.linalg.matvec(rows, tf.cast(scale, rows.dtype), transpose_a=True)


def _per_example(per_microbatch, like):
    """Repeats a [M] vector to one entry per example of `like` ([B, ...]), shaped to broadcast."""
    repeats = tf.shape(like)[0] // tf.shape(per_microbatch)[0]
    values = tf.repeat(tf.cast(per_microbatch, like.dtype), repeats)
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _generic_per_example_grads(record):
    """Per-example gradients of a layer's own weights, by a VJP of that layer alone."""
    variables = own_trainable_weights(record.layer)

    def one_example(args):
        x, gy = args
        with tf.GradientTape() as tape:
            tape.watch(variables)
            y = record.call_fn(x[None], *record.call_args, **record.call_kwargs)
        grads = tape.gradient(y, variables, output_gradients=gy[None],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    return tf.vectorized_map(one_example, (record.inputs, record.grad_output))
