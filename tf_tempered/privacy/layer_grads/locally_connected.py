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
"""LocallyConnected1D/2D (tf-keras; Keras 3 has neither): a Dense of its own at every output position.

``implementation=2`` and ``3`` (a masked dense kernel, a sparse one) in locally_connected_flat.py.
With ``implementation=1`` (the default) output position r has kernel W_r [k, f] (k: the
window's pixels × input channels) and z_{e,r} = p_{e,r}·W_r (+ b_r), p_{e,r} the input window of
example e at r. With g_{e,r} = ∂(Σ_m ℓ_m)/∂z_{e,r}, microbatch m's gradient of W_r is
Σ_{e∈m} p_{e,r} g_{e,r}ᵀ, and no two positions share a weight:

    ‖g_m‖² = Σ_r Σ_{e,e'∈m} (p_{e,r}·p_{e',r}) (g_{e,r}·g_{e',r})     (ghost norm per position)
           = Σ_r ‖p_{e,r}‖² ‖g_{e,r}‖²                                  (one example a microbatch)

plus Σ_r ‖Σ_{e∈m} g_{e,r}‖² for the bias b [positions, f]. The clipped sum
Σ_e c_{m(e)} p_{e,r} g_{e,r}ᵀ is one batched product over the positions (the layer's own
weight gradient with rescaled g: book-keeping); where a microbatch holds many examples the
per-microbatch gradients [M, R·k·f] are cheaper and are kept instead (as rows.py chooses).

The handler runs the layer's forward itself (`recorded_call`): the windows p as kh·kw strided
slices of the input, then one batched matmul, the same z as tf-keras' ``local_conv``, whose R
slices of the input (R = 196 for a 14×14 output) make the backward pass add R input-sized
gradients (under XLA, inside the DP step, each written out: 9× the non-private step). The
windows are recorded as the layer's input.

>>> import numpy as np
>>> p, g = np.ones([1, 2, 3]), np.full([1, 2, 1], 2.0)    # 1 example, 2 positions, k=3, f=1
>>> float(ghost_sq_norms(tf.constant(p), tf.constant(g), 1)[0])    # 2 · (3 · 4)
24.0
"""

import dataclasses
from typing import Tuple

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import locally_connected_flat as flat
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.rows_path import RowsPath
from tf_tempered.privacy.layer_grads.registry import register_named

__all__ = ["LocallyConnectedHandler", "LocallyConnectedHyperparameters", "ghost_sq_norms"]


@dataclasses.dataclass(frozen=True)
class LocallyConnectedHyperparameters:
    """Plain hyperparameters of a LocallyConnected1D/2D layer."""
    name: str
    implementation: int
    kernel_size: Tuple[int, ...]
    strides: Tuple[int, ...]
    channels_first: bool
    use_bias: bool
    # The kernel variable's shape: (positions R, window k, filters f) for implementation=1.
    kernel_shape: Tuple[int, ...]
    bias_shape: Tuple[int, ...]
    flat_sizes: Tuple[int, int]  # (I, O): the input's and the output's values per example


@register_named(keras.layers, "LocallyConnected1D", "LocallyConnected2D")
class LocallyConnectedHandler(Handler):
    """implementation=1: ghost norm per output position or materialized per-microbatch
    gradients, from windows its own forward made; 2 and 3: locally_connected_flat.py."""

    name = "locally_connected"
    summary = ("(tf-keras only) `implementation=1`: the layer's forward by kh·kw slices and one "
               "batched matmul, a ghost norm per output position (each has its own kernel) or "
               "materialized per-microbatch gradients, whichever is cheaper; `implementation=2`: "
               "(x²)ᵀ·Mask·(g²) per example, book-keeping (XᵀG)⊙Mask; `implementation=3`: "
               "per-example gradients of the sparse kernel by two gathers, kept per microbatch; "
               "bias from the output gradients")
    records_own_forward = True
    # Several calls (a shared layer; tf-keras' TimeDistributed folds time into the batch):
    # K rows per example, example-major, summed per microbatch by the math below.
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        implementation = getattr(layer, "implementation", None)
        if implementation not in (1, 2, 3):
            return None
        bias_shape = tuple(layer.bias.shape) if layer.use_bias else ()
        return LocallyConnectedHyperparameters(
            layer.name, implementation, tuple(layer.kernel_size), tuple(layer.strides),
            layer.data_format == "channels_first", bool(layer.use_bias),
            tuple(int(d) for d in layer.kernel.shape), bias_shape, _flat_sizes(layer))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def recorded_call(self, layer, hparams, call_fn, inputs, args, kwargs, wrap, options=None):
        """(activation(z), the windows p [B, R, k], z): the layer's output by its own math
        (implementation 2 and 3: by its own call, the input recorded)."""
        del options
        if args or any(v is not None for k, v in kwargs.items() if k != "training"):
            return None
        if not isinstance(inputs, tf.Tensor):
            return None
        if hparams.implementation != 1:  # the layer's own call, its activation bypassed
            with keras_bridge.without_activation(layer) as activation:
                z = wrap(call_fn(inputs))
            return activation(z), inputs, z
        p = _windows(inputs, hparams)
        kernel = tf.cast(layer.kernel, p.dtype)
        z = tf.transpose(tf.matmul(tf.transpose(p, [1, 0, 2]), kernel), [1, 0, 2])  # [B, R, f]
        spatial = _output_spatial(inputs, hparams)
        z = tf.reshape(z, [-1, *spatial, hparams.kernel_shape[2]])
        if hparams.channels_first:
            z = tf.transpose(z, [0, len(spatial) + 1] + list(range(1, len(spatial) + 1)))
        if hparams.use_bias:  # as tf-keras' bias_add: channels_first reshapes, not transposes
            bias_shape = ((hparams.kernel_shape[2],) + hparams.bias_shape[:-1]
                          if hparams.channels_first else hparams.bias_shape)
            z += tf.reshape(tf.cast(layer.bias, z.dtype), (1,) + bias_shape)
        z = wrap(z)
        return layer.activation(z), p, z

    def layer_result(self, call, hparams, layout):
        g_out = clip.widen(call.grad_output)
        norms = _window_norms if hparams.implementation == 1 else _flat_norms
        sq, kernel_sum, materialize = norms(call, g_out, hparams, layout)
        bias = None
        if hparams.use_bias:  # each example's bias gradient is its g, in the output's layout
            bias = clip.sum_microbatches(tf.reshape(g_out, [-1, int(np.prod(hparams.bias_shape))]),
                                         layout.num_microbatches)
            sq += tf.reduce_sum(tf.square(bias), 1)

        def clipped_sum(weights):
            grads = [tf.reshape(kernel_sum(weights), hparams.kernel_shape)]
            if hparams.use_bias:
                grads.append(tf.reshape(clip.weighted_sum(weights.zero_nonfinite(bias),
                                                          weights.scale), hparams.bias_shape))
            return grads

        return LayerResult(sq, clipped_sum, RowsPath(materialize))


def _window_norms(call, g_out, hparams, layout):
    """implementation=1: (sq [M], ClipWeights → kernel sum, materialized?) from the windows."""
    g = _output_rows(g_out, hparams)
    p = tf.cast(call.inputs, g.dtype)  # the windows (recorded_call)
    m = layout.num_microbatches
    rows = _rows_per_microbatch(p, layout)
    if _choose_materialize(hparams, layout, rows, g.dtype.size):
        per_microbatch = _materialized(p, g, m)
        return (clip.row_sq_norms(per_microbatch, layout.options),
                lambda weights: clip.weighted_sum(weights.zero_nonfinite(per_microbatch),
                                                  weights.scale), True)
    return ghost_sq_norms(p, g, m, rows), lambda weights: _book_keeping(p, g, weights), False


def _flat_norms(call, g_out, hparams, layout):
    """implementation=2 and 3 (locally_connected_flat.py) on the flattened input and output."""
    flat_in, flat_out = hparams.flat_sizes
    g = tf.reshape(g_out, [-1, flat_out])
    x = tf.reshape(tf.cast(call.inputs, g.dtype), [-1, flat_in])
    m, layer = layout.num_microbatches, call.layer
    if hparams.implementation == 2:
        mask = np.broadcast_to(np.asarray(layer.kernel_mask), hparams.kernel_shape)
        mask = tf.constant(mask.reshape(flat_in, flat_out), g.dtype)
        return flat.masked_result(x, g, mask, m, _rows_per_microbatch(x, layout), layout.options)
    index_pairs = tf.constant(np.asarray(layer.kernel_idxs, np.int32).reshape(-1, 2))
    return flat.sparse_result(x, g, index_pairs, m, layout.options) + (True,)


def _flat_sizes(layer):
    """(I, O) of implementation 2 (the kernel's two halves) and 3 (its sparse [O, I] shape)."""
    if layer.implementation == 2:
        shape = [int(d) for d in layer.kernel.shape]
        half = len(shape) // 2
        return int(np.prod(shape[:half])), int(np.prod(shape[half:]))
    if layer.implementation == 3:
        return int(layer.kernel_shape[1]), int(layer.kernel_shape[0])
    return 0, 0  # implementation 1 works on windows


def _windows(x, hparams):
    """p [B, R, k]: each output position's input window, in the kernel's feature order
    ((window pixels, channels) row-major; (channels, window pixels) for channels_first), as
    kh·kw strided slices of the input (their gradient: kh·kw pads, not one per position)."""
    rank = len(hparams.kernel_size)
    if hparams.channels_first:  # → channels last
        x = tf.transpose(x, [0] + list(range(2, rank + 2)) + [1])
    spatial = _output_spatial(x, dataclasses.replace(hparams, channels_first=False))
    offsets = np.ndindex(*hparams.kernel_size)
    slices = [x[(slice(None),) + tuple(slice(o, o + (n - 1) * s + 1, s) for o, n, s
                                       in zip(offset, spatial, hparams.strides))]
              for offset in offsets]
    windows = tf.stack(slices, rank + 1)  # [B, *spatial, window pixels, channels]
    if hparams.channels_first:
        windows = tf.transpose(windows, list(range(rank + 1)) + [rank + 2, rank + 1])
    return tf.reshape(windows, [-1] + list(hparams.kernel_shape[:2]))


def _output_spatial(x, hparams):
    """The output's spatial shape ('valid' windows) of an input x in the layer's data format."""
    rank = len(hparams.kernel_size)
    dims = x.shape[2:2 + rank] if hparams.channels_first else x.shape[1:1 + rank]
    return [(d - k) // s + 1 for d, k, s in zip(dims, hparams.kernel_size, hparams.strides)]


def _output_rows(g, hparams):
    """G [B, *spatial, f] (or [B, f, *spatial]) → [B, R, f], positions row-major as the layer's."""
    if hparams.channels_first:
        g = tf.transpose(g, [0] + list(range(2, g.shape.rank)) + [1])
    return tf.reshape(g, [-1] + list(hparams.kernel_shape[::2]))


def _rows_per_microbatch(p, layout):
    """Rows of p per microbatch if known while tracing (several per example for a layer
    called K times, or under tf-keras' TimeDistributed), else None."""
    rows, m = p.shape[0], layout.num_microbatches
    if rows is not None and isinstance(m, int):
        return rows // m
    return None


def _choose_materialize(hparams, layout, examples, itemsize):
    """Per microbatch of E rows the ghost norm costs R·E²·(k + f) multiply-adds, the
    kept gradients R·E·k·f and M·R·k·f values (within materialize_max_bytes)."""
    forced = layout.options.forced
    if forced in ("ghost", "materialize"):
        return forced == "materialize"
    m = layout.num_microbatches
    _, k, f = hparams.kernel_shape
    fits = (isinstance(m, int)
            and m * int(np.prod(hparams.kernel_shape)) * itemsize
            <= layout.options.materialize_max_bytes)
    if examples is None:  # E unknown: the ghost norm's E² may be large
        return fits
    return examples * (k + f) > k * f and fits


def ghost_sq_norms(p, g, num_microbatches, rows_per_microbatch=None):
    """[M] Σ_r ‖Σ_{e∈m} p_{e,r} g_{e,r}ᵀ‖² for p [B, R, k], g [B, R, f], without the gradients
    (rows_per_microbatch: E if known while tracing; else decided per step)."""
    def one_row():
        return tf.reduce_sum(tf.reduce_sum(tf.square(p), -1) * tf.reduce_sum(tf.square(g), -1), 1)

    def grams():
        p_by_position, g_by_position = (_by_position(t, num_microbatches) for t in (p, g))
        p_gram, g_gram = (tf.matmul(t, t, transpose_b=True) for t in (p_by_position, g_by_position))
        return tf.reduce_sum(p_gram * g_gram, [1, 2, 3])

    if rows_per_microbatch is None:
        return tf.cond(tf.equal(tf.shape(p)[0], num_microbatches), one_row, grams)
    return one_row() if rows_per_microbatch == 1 else grams()


def _by_position(t, num_microbatches):
    """[B, R, d] → [M, R, E, d]."""
    grouped = tf.reshape(t, [num_microbatches, -1] + t.shape[1:].as_list())
    return tf.transpose(grouped, [0, 2, 1, 3])


def _materialized(p, g, num_microbatches):
    """[M, R·k·f]: every microbatch's gradient of the kernel."""
    per_position = tf.matmul(_by_position(p, num_microbatches), _by_position(g, num_microbatches),
                             transpose_a=True)
    return tf.reshape(per_position, [num_microbatches, -1])


def _book_keeping(p, g, weights):
    """Σ_e c_{m(e)} p_{e,r} g_{e,r}ᵀ as [R, k, f]: the weight gradient of c·g."""
    p = weights.zero_nonfinite(p, per_example=True)
    g = weights.zero_nonfinite(g, per_example=True) * clip.per_example(weights.scale, g)
    return tf.matmul(tf.transpose(p, [1, 2, 0]), tf.transpose(g, [1, 0, 2]))
