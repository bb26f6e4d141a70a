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
"""Conv2D patches and per-example kernel gradients against TF's own ops and tapes."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy.layer_grads import conv_grads


def _conv(filters, kernel, strides, padding, dilation, channels, size=(11, 9)):
    layer = keras.layers.Conv2D(filters, kernel, strides=strides, padding=padding,
                                dilation_rate=dilation)
    layer.build((None,) + size + (channels,))
    return layer


@pytest.mark.parametrize("kernel,strides,padding,dilation", [
    (3, 1, "same", 1), (4, 2, "valid", 1), (8, 2, "same", 1), ((3, 2), (2, 1), "same", 1),
    (3, 1, "valid", 2), (3, 1, "same", 2), (5, 3, "same", 1)])
def test_conv_patches_equal_extract_patches(kernel, strides, padding, dilation):
    layer = _conv(4, kernel, strides, padding, dilation, channels=3)
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 11, 9, 3)), tf.float32)
    ours = conv_grads.patches(layer, x)
    kh, kw = layer.kernel_size
    reference = tf.image.extract_patches(
        x, [1, kh, kw, 1], [1, *layer.strides, 1], [1, *layer.dilation_rate, 1], padding.upper())
    np.testing.assert_array_equal(ours.numpy(), reference.numpy().reshape(ours.shape))
    # Patch rows times the kernel give the layer's own (pre-bias) output.
    z = tf.matmul(ours, tf.reshape(layer.kernel, [-1, layer.filters]))
    expected = layer.convolution_op(x, layer.kernel)
    np.testing.assert_allclose(z.numpy().reshape(expected.shape), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize("dilation", [1, 2])
def test_conv_patches_with_unknown_spatial_size(dilation):
    layer = _conv(4, 3, 2 if dilation == 1 else 1, "same", dilation, channels=2)
    x = np.random.default_rng(1).normal(size=(3, 11, 9, 2)).astype("float32")
    patches = tf.function(lambda t: conv_grads.patches(layer, t),
                          input_signature=[tf.TensorSpec([None, None, None, 2])])
    static = conv_grads.patches(layer, tf.constant(x))
    np.testing.assert_array_equal(patches(x).numpy(), static.numpy())
    reference = tf.image.extract_patches(x, [1, 3, 3, 1], [1, *layer.strides, 1],
                                         [1, dilation, dilation, 1], "SAME")
    np.testing.assert_array_equal(patches(x).numpy(), reference.numpy().reshape(3, -1, 18))


@pytest.mark.parametrize("chunk", [64, 3])
def test_depthwise_per_example_kernel_grads_equal_per_example_tapes(chunk):
    layer = _conv(3, 4, 2, "same", 1, channels=2)
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(7, 11, 9, 2)), tf.float32)
    g = tf.constant(rng.normal(size=(7, 6, 5, 3)), tf.float32)
    ours = conv_grads.per_example_kernel_grads(layer, x, g, chunk=chunk)
    # The same with the batch size unknown while tracing (chunks zero-padded).
    dynamic = tf.function(
        lambda xs, gs: conv_grads.per_example_kernel_grads(layer, xs, gs, chunk=chunk),
        input_signature=[tf.TensorSpec([None, 11, 9, 2]), tf.TensorSpec([None, 6, 5, 3])])
    np.testing.assert_allclose(dynamic(x, g).numpy(), ours.numpy(), atol=1e-6)
    assert ours.shape == (16, 7, 6)  # [kh·kw, B, cin·cout]
    for b in range(7):
        with tf.GradientTape() as tape:
            z = layer.convolution_op(x[b:b + 1], layer.kernel)
        expected = tape.gradient(z, layer.kernel, output_gradients=g[b:b + 1])
        np.testing.assert_allclose(ours[:, b].numpy(), expected.numpy().reshape(16, 6), atol=1e-5)


@pytest.mark.parametrize("kernel,strides,padding,dilation", [
    (3, 1, "same", 1), (4, 2, "valid", 1), (8, 2, "same", 1), ((3, 2), (2, 1), "same", 1),
    (3, 1, "valid", 2), ((2, 3), 1, "same", (2, 1)), (5, 3, "same", 1), (1, 1, "valid", 1)])
@pytest.mark.parametrize("jit_compile", [False, True])
def test_kernel_grads_by_offsets_equal_per_example_tapes(kernel, strides, padding, dilation,
                                                         jit_compile):
    """One product per kernel offset (what XLA steps take) = each example's own gradient,
    strided, dilated, padded evenly or not, eagerly and compiled by XLA."""
    layer = _conv(3, kernel, strides, padding, dilation, channels=2)
    rng = np.random.default_rng(3)
    x = tf.constant(rng.normal(size=(5, 11, 9, 2)), tf.float32)
    shape = layer.convolution_op(x, layer.kernel).shape
    g = tf.constant(rng.normal(size=shape), tf.float32)
    ours = tf.function(lambda xs, gs: conv_grads.per_example_kernel_grads_by_offsets(layer, xs, gs),
                       jit_compile=jit_compile)(x, g).numpy()
    kh, kw = layer.kernel_size
    assert ours.shape == (kh * kw, 5, 2 * 3)  # [kh·kw, B, cin·cout], as the depthwise backprop
    for b in range(5):
        with tf.GradientTape() as tape:
            z = layer.convolution_op(x[b:b + 1], layer.kernel)
        expected = tape.gradient(z, layer.kernel, output_gradients=g[b:b + 1])
        np.testing.assert_allclose(ours[:, b], expected.numpy().reshape(kh * kw, 6), atol=1e-5)


def test_depthwise_per_example_kernel_grads_refuse_dilation():
    # TF's CPU depthwise backprop-filter kernel ignores `dilations` (wrong values
    # eagerly, a crash in graphs): the engine uses patches or the native op instead.
    layer = _conv(3, 3, 1, "same", 2, channels=2)
    x, g = tf.zeros([2, 11, 9, 2]), tf.zeros([2, 11, 9, 3])
    with pytest.raises(ValueError, match="dilation_rate=\\(2, 2\\).*patches"):
        conv_grads.per_example_kernel_grads(layer, x, g)


@pytest.mark.parametrize("kernel,strides,dilation,padding,size", [
    ((2, 2, 2), (1, 1, 1), (1, 1, 1), "same", (5, 4, 6)),
    ((3, 2, 2), (2, 1, 2), (1, 1, 1), "same", (5, 4, 4)),
    ((2, 3, 2), (1, 1, 1), (2, 1, 3), "same", (5, 6, 7)),
    ((2, 2, 2), (1, 1, 1), (2, 2, 2), "valid", (5, 6, 7)),
    ((3, 1, 2), (1, 1, 1), (1, 3, 2), "same", (4, 4, 3))])
@pytest.mark.parametrize("known_size", [True, False])
def test_conv3d_patches_times_kernel_equal_the_convolution(kernel, strides, dilation, padding,
                                                           size, known_size):
    """Conv3D patches made by strided slices (dilated; extract_volume_patches has no
    dilations) and by extract_volume_patches: patches · kernel = TF's own convolution,
    and the two ways agree where both apply."""
    from tf_tempered.privacy.layer_grads import conv3d  # pylint: disable=g-import-not-at-top
    rng = np.random.default_rng(0)
    params = conv3d.Conv3DHyperparameters("c", kernel, strides, padding, False, (*kernel, 3, 4), 1,
                                 dilation)
    x = tf.constant(rng.normal(size=(2, *size, 3)), tf.float32)
    w = tf.constant(rng.normal(size=(*kernel, 3, 4)), tf.float32)
    reference = tf.nn.convolution(x, w, strides=list(strides), padding=padding.upper(),
                                  dilations=list(dilation))
    spec = [tf.TensorSpec([None] + ([*size] if known_size else [None] * 3) + [3])]
    slices = tf.function(lambda t: conv3d._dilated_volume_patches(params, t),
                         input_signature=spec, autograph=False)(x)
    assert slices.shape[1:4] == reference.shape[1:4]
    np.testing.assert_allclose(tf.tensordot(slices, tf.reshape(w, [-1, 4]), 1).numpy(),
                               reference.numpy(), rtol=1e-5, atol=1e-5)
    if dilation == (1, 1, 1):
        np.testing.assert_array_equal(slices.numpy(), conv3d._volume_patches(params, x).numpy())
