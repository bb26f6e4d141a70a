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
"""The sizes of a weighted layer's input axes that its weights fix, for a traced input whose
static shape leaves them unknown (``tf.reshape(t, [tf.shape(t)[0], -1])`` in a Lambda, on
batches of unknown size): Keras' own call needs no static size, but the DP engine sizes its
norm paths by them (Keras 3 Dense, Conv1D, EinsumDense, an LSTM and MultiHeadAttention's
projections failed with a TypeError; probes F3, G3 F4).

An EinsumDense's kernel fixes each input axis whose letter it shares: in ``"abc,bd->acd"``
axis 1 (``b``), not the last one.

>>> dense = keras.layers.Dense(3)
>>> dense.build((None, 4))
>>> declared_axes(dense)
{-1: 4}
>>> einsum = keras.layers.EinsumDense("abc,cd->abd", (5, 2))
>>> einsum.build((None, 5, 7))
>>> declared_axes(einsum)
{2: 7}
>>> einsum_operands("...b, bd -> ...d")
('...b', 'bd', '...d')
"""

from tf_tempered._compat import keras, tf

__all__ = ["declared_axes", "einsum_operands", "with_declared_axes"]


def einsum_operands(equation):
    """The (input, kernel, output) operand strings of a two-operand einsum ``equation``,
    spaces dropped and ``...`` kept, or None when it has not that form."""
    lhs, arrow, output = equation.replace(" ", "").partition("->")
    operands = lhs.split(",")
    if not arrow or "->" in output or len(operands) != 2:
        return None
    return (*operands, output)


def declared_axes(layer):
    """{axis: size} of ``layer``'s input axes its weights fix (negative axes count from the
    end): the axes Keras' InputSpec declares (Dense, convolutions), the last one from the
    kernel of an RNN layer's cell, those an EinsumDense's kernel shares with its input."""
    axes = dict(getattr(getattr(layer, "input_spec", None), "axes", None) or {})
    if -1 not in axes and isinstance(layer, keras.layers.RNN):
        cell = getattr(layer, "cell", None)
        cell = (getattr(cell, "cells", None) or [cell])[0]
        kernel = getattr(cell, "kernel", None)
        if kernel is not None and len(kernel.shape) == 2:  # [in, units]
            axes[-1] = kernel.shape[0]
        elif kernel is not None and getattr(layer, "data_format", None) == "channels_last":
            axes[-1] = kernel.shape[-2]  # a ConvLSTM's [*window, in, filters] (channels_first:
            # the last axis is a spatial one; probe G3, F3)
    if isinstance(getattr(layer, "equation", None), str):
        axes.update(_einsum_axes(layer))
    return {axis: int(size) for axis, size in axes.items() if size is not None}


def _einsum_axes(layer):
    operands = einsum_operands(layer.equation)
    kernel = getattr(layer, "kernel", None)
    if operands is None or kernel is None or len(operands[1]) != len(kernel.shape):
        return {}
    inputs, kernel_spec, _ = operands
    head, ellipsis, tail = inputs.partition("...")
    positions = ([(letter, i) for i, letter in enumerate(head)]
                 + [(letter, i - len(tail)) for i, letter in enumerate(tail)]
                 if ellipsis else [(letter, i) for i, letter in enumerate(inputs)])
    return {axis: kernel.shape[kernel_spec.index(letter)]
            for letter, axis in positions if letter in kernel_spec}


def with_declared_axes(layer, inputs):
    """Gives a traced tensor ``inputs`` the sizes ``layer`` declares for its unknown axes (in
    place: a static fact its weights make true), leaving every other axis as it is."""
    if (not isinstance(inputs, tf.Tensor) or tf.executing_eagerly() or inputs.shape.rank is None
            or inputs.shape.rank < 2 or inputs.shape.is_fully_defined()):
        return
    rank, sizes = inputs.shape.rank, inputs.shape.as_list()
    for axis, size in declared_axes(layer).items():
        if -rank <= axis < rank and axis % rank and sizes[axis] is None:
            sizes[axis] = size  # (never the batch axis)
    inputs.set_shape(sizes)
