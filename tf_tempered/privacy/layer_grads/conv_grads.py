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
"""Per-example building blocks for Conv2D layers: input patches and kernel gradients.

A Conv2D's gradient for one example is Σ_r a_r g_rᵀ over its output pixels r, with
a_r the input patch under pixel r (kh·kw·cin values, the kernel's row order) and
g_r the output gradient there. `patches` gives the a_r of a batch; for layers
with few channels `per_example_kernel_grads` gives the per-example sums directly
from one depthwise-conv backprop, without patches; under XLA
`per_example_kernel_grads_by_offsets` gives them from one product per kernel offset; for
strided layers where TF's kernels are not oneDNN's, `per_example_kernel_grads_by_blocks`
from one product per block of stride×stride offsets.
"""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy import native

__all__ = ["map_padded_chunks", "native_op_applies", "padding_before", "patches",
           "per_example_kernel_grads", "per_example_kernel_grads_by_blocks",
           "per_example_kernel_grads_by_offsets"]


def native_op_applies(x, g):
    """Whether a native per-example convolution op (Conv2D's, the depthwise layers') can take
    input x and output gradient g: float32/64, static spatial size (it fixes the padding),
    where native.usable says the ops run (no GPU: a CPU op would copy every layer's
    activations off it)."""
    return g.dtype in (tf.float32, tf.float64) and None not in x.shape[1:] and native.usable()


def patches(layer, x):
    """Input patches of a Conv2D as [B, output pixels, kh·kw·cin] (the kernel's row order)."""
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.strides, layer.dilation_rate
    height, width, cin = x.shape[1:]
    if height is None or width is None:
        patches = tf.image.extract_patches(
            x, sizes=[1, kh, kw, 1], strides=[1, sh, sw, 1], rates=[1, dh, dw, 1],
            padding=layer.padding.upper())
        return tf.reshape(patches, [tf.shape(x)[0], -1, patches.shape[-1]])
    # One gather of whole pixels (cin values each) from the padded image: several
    # times faster on CPU than tf.image.extract_patches, same result.
    rows_out, pad_h = _axis(height, kh, sh, dh, layer.padding)
    cols_out, pad_w = _axis(width, kw, sw, dw, layer.padding)
    if any(pad_h + pad_w):
        x = tf.pad(x, [[0, 0], list(pad_h), list(pad_w), [0, 0]])
    padded_width = width + sum(pad_w)
    i, j, a, b = np.meshgrid(np.arange(rows_out), np.arange(cols_out), np.arange(kh),
                             np.arange(kw), indexing="ij")
    index = ((i * sh + a * dh) * padded_width + j * sw + b * dw).reshape(-1).astype(np.int32)
    flat = tf.reshape(x, [-1, (height + sum(pad_h)) * padded_width, cin])
    return tf.reshape(tf.gather(flat, index, axis=1), [-1, rows_out * cols_out, kh * kw * cin])


def per_example_kernel_grads_by_offsets(layer, x, g):
    """Per-example ∂ℓ_b/∂kernel of a Conv2D as [kh·kw, B, cin·cout], one product per kernel offset.

    Example n's gradient at kernel offset (p, q) is Σ_ij x̄[n, p·dh + i·sh, q·dw + j·sw, :] ⊗
    g[n, i, j, :] (x̄: the input zero-padded as TF pads it): a strided slice of x̄ against g,
    no patch tensor. XLA fuses each slice into its product: on this project's CPU 2.0x
    faster than patches for the MNIST CNN's conv1 at B = 256 (5.9 against 11.6 ms) and
    1.6-2.5x for the CIFAR-10 CNN's conv1-conv3 (benchmarks/conv_kernel_grads.py); under TF's
    executor, one op per offset, patches are as fast or faster, so only XLA steps take it.
    Static spatial sizes only.

    >>> from tf_tempered._compat import keras
    >>> layer = keras.layers.Conv2D(2, 3, strides=2, padding="same")
    >>> x, g = tf.random.normal([4, 5, 5, 1]), tf.random.normal([4, 3, 3, 2])
    >>> by_offsets = per_example_kernel_grads_by_offsets(layer, x, g)  # [9, 4, 1·2]
    >>> by_patches = tf.einsum("bpk,bpo->kbo", patches(layer, x), tf.reshape(g, [4, 9, 2]))
    >>> by_offsets.shape, float(tf.reduce_max(tf.abs(by_offsets - by_patches))) < 1e-5
    (TensorShape([9, 4, 2]), True)
    """
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.strides, layer.dilation_rate
    height, width, cin = x.shape[1:]
    oh, ow, cout = g.shape[1:]
    pad_h = _axis(height, kh, sh, dh, layer.padding)[1]
    pad_w = _axis(width, kw, sw, dw, layer.padding)[1]
    x = tf.cast(x, g.dtype)
    if any(pad_h + pad_w):
        x = tf.pad(x, [[0, 0], list(pad_h), list(pad_w), [0, 0]])
    per_offset = [tf.einsum("nijc,nijo->nco",
                            x[:, p * dh:p * dh + (oh - 1) * sh + 1:sh,
                              q * dw:q * dw + (ow - 1) * sw + 1:sw, :], g)
                  for p in range(kh) for q in range(kw)]
    return tf.reshape(tf.stack(per_offset), [kh * kw, -1, cin * cout])


def per_example_kernel_grads_by_blocks(layer, x, g):
    """Per-example ∂ℓ_b/∂kernel of a strided Conv2D as [kh·kw, B, cin·cout], from blocks.

    Cut the padded input x̄ into sh×sw blocks: X[n, u, v, (i, j, c)] = x̄[n, u·sh + i,
    v·sw + j, c]. Kernel offset (a·sh + i, b·sw + j) reads X[n, y + a, z + b, (i, j, ·)]
    under output pixel (y, z): each of the ⌈kh/sh⌉·⌈kw/sw⌉ stride-1 slices of X against g
    gives sh·sw offsets at once (offsets past the kernel, when sh ∤ kh, are dropped). For
    the MNIST CNN's conv1 (8×8, stride 2) that is 16 products instead of 64, and no patch
    tensor: where TF's CPU kernels are Eigen's 3x faster than patches (11.0 against 33.5
    ms; benchmarks/results/conv_blocks.md). Undilated layers with static spatial sizes only.

    >>> from tf_tempered._compat import keras
    >>> layer = keras.layers.Conv2D(2, 5, strides=(2, 3), padding="same")  # 2 ∤ 5: dropped rows
    >>> x, g = tf.random.normal([4, 9, 7, 3]), tf.random.normal([4, 5, 3, 2])
    >>> float(tf.reduce_max(tf.abs(per_example_kernel_grads_by_blocks(layer, x, g)
    ...                            - per_example_kernel_grads_by_offsets(layer, x, g)))) < 1e-4
    True
    """
    if tuple(layer.dilation_rate) != (1, 1):
        raise ValueError(f"per_example_kernel_grads_by_blocks: layer {layer.name!r} is dilated "
                         f"({tuple(layer.dilation_rate)}); use patches or offsets instead.")
    (kh, kw), (sh, sw) = layer.kernel_size, layer.strides
    height, width, cin = x.shape[1:]
    oh, ow, cout = g.shape[1:]
    ah, aw = -(-kh // sh), -(-kw // sw)  # block offsets per axis
    rows, cols = (oh + ah - 1) * sh, (ow + aw - 1) * sw  # the padded pixels the blocks cover
    top = _axis(height, kh, sh, 1, layer.padding)[1][0]
    left = _axis(width, kw, sw, 1, layer.padding)[1][0]
    # Zeros past TF's own padding are read only by the dropped offsets; pixels past `rows`
    # (`cols`) by no output pixel.
    x = tf.pad(tf.cast(x, g.dtype), [[0, 0], [top, max(rows - height - top, 0)],
                                     [left, max(cols - width - left, 0)], [0, 0]])
    x = tf.reshape(x[:, :rows, :cols], [-1, rows // sh, sh, cols // sw, sw, cin])
    blocks = tf.reshape(tf.transpose(x, [0, 1, 3, 2, 4, 5]),
                        [-1, rows // sh, cols // sw, sh * sw * cin])
    per_block = tf.stack([tf.einsum("nyzk,nyzo->nko", blocks[:, a:a + oh, b:b + ow], g)
                          for a in range(ah) for b in range(aw)])  # [ah·aw, B, (i, j, c), o]
    per_block = tf.reshape(per_block, [ah, aw, -1, sh, sw, cin * cout])
    per_offset = tf.transpose(per_block, [0, 3, 1, 4, 2, 5])  # [a, i, b, j, B, (c, o)]
    per_offset = tf.reshape(per_offset, [ah * sh, aw * sw, -1, cin * cout])[:kh, :kw]
    return tf.reshape(per_offset, [kh * kw, -1, cin * cout])


def padding_before(layer, x):
    """(top, left) zero padding TF adds for this Conv2D and input (static spatial size)."""
    (kh, kw), (sh, sw), (dh, dw) = layer.kernel_size, layer.strides, layer.dilation_rate
    return (_axis(x.shape[1], kh, sh, dh, layer.padding)[1][0],
            _axis(x.shape[2], kw, sw, dw, layer.padding)[1][0])


def _axis(size, kernel, stride, dilation, padding):
    """(output size, (pad before, pad after)) of one spatial axis, as TF computes them."""
    extent = (kernel - 1) * dilation + 1
    if padding == "valid":
        return (size - extent) // stride + 1, (0, 0)
    out = -(-size // stride)
    total = max((out - 1) * stride + extent - size, 0)
    return out, (total // 2, total - total // 2)


def per_example_kernel_grads(layer, x, g, chunk=128):
    """Per-example ∂ℓ_b/∂kernel of a Conv2D as [kh·kw, B, cin·cout], no patches.

    Examples on the middle axis is the layout the depthwise backprop produces:
    norms and the clipped sum need no transpose of it. Undilated layers only:
    TF 2.21's CPU depthwise backprop-filter ignores `dilations` eagerly (wrong
    gradients) and fails in graphs. The batch goes through the backprop in
    chunks of `chunk` examples (EngineOptions.depthwise_chunk says why).
    """
    if tuple(layer.dilation_rate) != (1, 1):
        raise ValueError(
            f"per_example_kernel_grads: layer {layer.name!r} has dilation_rate="
            f"{tuple(layer.dilation_rate)}, but TF's CPU depthwise backprop-filter kernel "
            "ignores dilations (wrong gradients) or fails; use patches instead.")
    x = tf.cast(x, g.dtype)
    batch = x.shape[0]
    if batch is not None:
        return tf.concat([_depthwise_per_example(layer, x[i:i + chunk], g[i:i + chunk])
                          for i in range(0, batch, chunk)], 1)

    def in_chunks():
        grads = map_padded_chunks(lambda xc, gc: _depthwise_per_example(layer, xc, gc),
                                  x, g, chunk, parallel_iterations=2)
        grads = tf.transpose(grads, [1, 0, 2, 3])  # [kh·kw, chunks, chunk, cin·cout]
        return tf.reshape(grads, [grads.shape[0], -1, grads.shape[-1]])[:, :tf.shape(x)[0]]

    return tf.cond(tf.shape(x)[0] <= chunk, lambda: _depthwise_per_example(layer, x, g), in_chunks)


def map_padded_chunks(fn, x, g, chunk, parallel_iterations):
    """tf.map_fn of fn(x_chunk, g_chunk) over chunks of `chunk` examples: [chunks, ...].

    For a batch size unknown while tracing: x and g are zero-padded to whole chunks
    (zero inputs and output gradients give zero gradients); callers drop the
    padded examples from the result.
    """
    padding = -tf.shape(x)[0] % chunk

    def in_chunks(t):  # sizes unknown while tracing (not the first) from the tensor's shape
        shape = [-1, chunk] + [tf.shape(t)[i] if size is None else size
                               for i, size in enumerate(t.shape[1:].as_list(), 1)]
        return tf.reshape(tf.pad(t, [[0, padding]] + [[0, 0]] * (t.shape.rank - 1)), shape)

    chunked = [in_chunks(t) for t in (x, g)]
    return tf.map_fn(lambda xg: fn(*xg), chunked, fn_output_signature=g.dtype,
                     parallel_iterations=parallel_iterations)


def _depthwise_per_example(layer, x, g):
    batch = tf.shape(x)[0]
    height, width, cin = x.shape[1], x.shape[2], x.shape[3]
    oh, ow, cout = g.shape[1], g.shape[2], g.shape[3]
    kh, kw = layer.kernel_size
    # Input channel (b, c) of a depthwise conv with multiplier cout yields output
    # channels (b, c, o); the backprop filter then holds per-example gradients.
    x_folded = tf.reshape(tf.transpose(x, [1, 2, 0, 3]), [1, height, width, batch * cin])
    g_folded = tf.transpose(g, [1, 2, 0, 3])[:, :, :, None, :]
    if cin > 1:
        g_folded = tf.broadcast_to(g_folded, [oh, ow, batch, cin, cout])
    g_folded = tf.reshape(g_folded, [1, oh, ow, batch * cin * cout])
    filters = tf.compat.v1.nn.depthwise_conv2d_native_backprop_filter(
        x_folded, tf.stack([kh, kw, batch * cin, cout]), g_folded,
        strides=[1, *layer.strides, 1], padding=layer.padding.upper(),
        dilations=[1, *layer.dilation_rate, 1])
    return tf.reshape(filters, [kh * kw, batch, cin * cout])
