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
"""The width of the rows a weighted layer takes (its input's last axis), as its weights fix
it, for a traced input whose static last axis is unknown (``tf.reshape(t, [tf.shape(t)[0],
-1])`` in a Lambda, on batches of unknown size): Keras' own call needs no static width, but
the DP engine sizes its norm paths by it (Keras 3 Dense, Conv1D, EinsumDense, an LSTM and
MultiHeadAttention's projections failed with a TypeError; probe F3).

>>> dense = keras.layers.Dense(3)
>>> dense.build((None, 4))
>>> declared_width(dense)
4
>>> einsum = keras.layers.EinsumDense("abc,cd->abd", (5, 2))
>>> einsum.build((None, 5, 7))
>>> declared_width(einsum)
7
"""

from tf_tempered._compat import keras, tf

__all__ = ["declared_width", "with_declared_width"]


def declared_width(layer):
    """The last axis of the input ``layer``'s weights fix (an int), or None: from the axes
    Keras' InputSpec declares (Dense, convolutions), the kernel of an RNN layer's cell, an
    EinsumDense's equation."""
    axes = getattr(getattr(layer, "input_spec", None), "axes", None) or {}
    width = axes.get(-1)
    if width is None and isinstance(layer, keras.layers.RNN):
        cell = getattr(layer, "cell", None)
        cell = (getattr(cell, "cells", None) or [cell])[0]
        kernel = getattr(cell, "kernel", None)
        if kernel is not None and len(kernel.shape) == 2:  # [in, units]
            width = kernel.shape[0]
        elif kernel is not None and getattr(layer, "data_format", None) == "channels_last":
            width = kernel.shape[-2]  # a ConvLSTM's [*window, in, filters] (channels_first:
            # the last axis is a spatial one; probe G3, F3)
    if width is None and isinstance(getattr(layer, "equation", None), str):
        width = _einsum_width(layer)
    return int(width) if width is not None else None


def _einsum_width(layer):
    inputs, _, rest = layer.equation.partition(",")
    kernel_spec = rest.partition("->")[0]
    kernel = getattr(layer, "kernel", None)
    last = inputs[-1:]
    if kernel is None or not last.isalpha() or last not in kernel_spec:
        return None
    return kernel.shape[kernel_spec.index(last)]


def with_declared_width(layer, inputs):
    """Gives a traced tensor ``inputs`` of unknown last axis the width ``layer`` declares
    (in place: a static fact its weights make true), leaving every other axis as it is."""
    if (not isinstance(inputs, tf.Tensor) or tf.executing_eagerly() or inputs.shape.rank is None
            or inputs.shape.rank < 2 or inputs.shape[-1] is not None):
        return
    width = declared_width(layer)
    if width is not None:
        inputs.set_shape(inputs.shape[:-1].concatenate([width]))
