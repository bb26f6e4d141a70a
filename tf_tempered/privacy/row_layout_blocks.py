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
"""Rules of row_layout's walk for SpaceToBatchND and BatchToSpaceND, the ops a dilated
convolution or pooling written with tf.nn (``tf.nn.convolution(..., dilations=2)``,
``tf.nn.depthwise_conv2d``, ``tf.nn.atrous_conv2d``) runs between: ``[B, H, W, C] ->
[k·B, H/b0, W/b1, C]``, k = b0·b1 blocks of the batch, block-major (row j·B + i holds
example i's block j). The walk ended at them: a batch statistic after such a convolution
trained, one example moving the clipped sum 4.4-4.7 C (probe H3).

Their rows are :class:`Blocked`: ops that compute each row on its own (convolutions,
pooling, a bias, elementwise ops with data of no example) keep the mark, and BatchToSpaceND
of the same block shape puts the examples back on axis 0. Anything else that reads blocked
rows sees them REARRANGED (refused at a layer's input), and blocked rows combined with the
batch's rows in place are MIXED.

>>> import tensorflow as tf
>>> from tf_tempered.privacy.row_layout import batch_axis
>>> kernel = tf.ones([3, 3, 4, 2])
>>> found = []
>>> @tf.function
... def where(images):
...     blocks = tf.space_to_batch(images, [2, 2], [[0, 0], [0, 0]])
...     found.extend(batch_axis(t, {images.op}) for t in (
...         tf.nn.convolution(images, kernel, padding="SAME", dilations=2),
...         tf.nn.depthwise_conv2d(images, tf.ones([3, 3, 4, 1]), [1, 1, 1, 1], "SAME",
...                                dilations=[2, 2]),
...         tf.batch_to_space(blocks - tf.reduce_mean(blocks, 0), [2, 2], [[0, 0], [0, 0]]),
...         tf.batch_to_space(blocks, [2, 1], [[0, 0], [0, 0]]),
...         tf.reshape(blocks, [-1, 4 * 4 * 4]) - tf.reshape(images, [-1, 4 * 4 * 4])))
>>> where(tf.ones((3, 8, 8, 4)))
>>> found
[0, 0, MIXED, REARRANGED, MIXED]
"""

from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, UNKNOWN, KeyedMark,
                                                  normalized_axis, one_layout, static_values)

__all__ = ["Blocked", "is_blocked", "follow_blocked", "RULES"]


class Blocked(KeyedMark):
    """Rows of the batch's examples in ``blocks`` (the block shape) block-major."""

    def __init__(self, blocks):
        super().__init__("BLOCKED", tuple(blocks))
        self.blocks = self.key


def is_blocked(layout):
    return isinstance(layout, Blocked)


# Ops computing each row of their first input on its own (with inputs of no example: a
# kernel, a bias, a constant).
_PER_ROW = frozenset({
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MaxPool", "MaxPoolV2", "AvgPool",
    "MaxPool3D", "AvgPool3D", "BiasAdd", "Identity", "Cast", "Relu", "Relu6", "Elu", "Selu",
    "LeakyRelu", "Softplus", "Tanh", "Sigmoid", "Neg", "Abs", "Square", "Sqrt", "Rsqrt",
    "Exp", "Log", "Log1p", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum",
    "SquaredDifference", "Pow"})


def _space_to_batch(op, layouts):
    """[B, spatial..., C] -> [k·B, ...]: the examples' blocks, block-major."""
    if any(found is not None for found in layouts[1:]):
        return MIXED  # a block shape or padding read from the batch's data
    if layouts[0] != 0 or not isinstance(layouts[0], int):
        return REARRANGED  # another axis's (or picked) rows spread over the first
    try:
        return Blocked(static_values(op.inputs[1]))
    except ValueError:
        return REARRANGED


def follow_blocked(op, layouts):
    """The layout of ``op``'s output when an input is :class:`Blocked`."""
    found = one_layout([found for found in layouts if not is_blocked(found)])
    blocked = {found for found in layouts if is_blocked(found)}
    if found is not None and found is not UNKNOWN:
        return MIXED  # blocked rows with the batch's in place (or picked, rearranged) rows
    if len(blocked) > 1:
        return REARRANGED
    mark = blocked.pop()
    if op.type == "BatchToSpaceND":
        if layouts[0] != mark or any(found is not None for found in layouts[1:]):
            return MIXED  # crops or block shape from the batch's data
        try:
            return 0 if tuple(static_values(op.inputs[1])) == mark.blocks else REARRANGED
        except ValueError:
            return REARRANGED
    if _per_row(op) and all(found is None or found == mark for found in layouts) and all(
            found is None for found in layouts[1:] if op.type in _WITH_KERNEL):
        return mark
    return REARRANGED  # (refused at a layer's input and in the loss)


def _batch_to_space(op, layouts):
    """BatchToSpaceND of rows that are not blocks of the batch (their rule above): rows of
    axis 0 spread into the spatial axes, across examples (before: UNKNOWN, so a reversal or a
    batch statistic before it went unseen; probe P2, F2 and F3). A block shape of ones
    changes nothing."""
    if any(found is not None for found in layouts[1:]):
        return MIXED  # a block shape or crops read from the batch's data
    try:
        ones = all(size == 1 for size in static_values(op.inputs[1]))
    except ValueError:
        ones = False
    return layouts[0] if ones else REARRANGED


def _per_row(op):
    """Whether ``op`` computes each row of its first input on its own: the ops of _PER_ROW,
    and an axis added or removed after the first (a 1-D dilated convolution's ExpandDims and
    Squeeze between the blocks: probe P2, F1)."""
    if len(op.outputs) != 1:
        return False
    if op.type == "ExpandDims":
        try:
            axis = static_values(op.inputs[1])[0]
        except ValueError:
            return False
        return normalized_axis(axis, op.outputs[0].shape.rank) != 0
    if op.type == "Squeeze":
        dims = op.get_attr("squeeze_dims")
        rank = op.inputs[0].shape.rank
        return bool(dims) and rank is not None and all(
            normalized_axis(axis, rank) != 0 for axis in dims)
    return op.type in _PER_ROW


# Per-row ops whose inputs after the first are a kernel or a bias: one of the batch's data
# would be every row's (a kernel made from the blocks themselves: probe P2, F5).
_WITH_KERNEL = frozenset({"Conv2D", "Conv3D", "DepthwiseConv2dNative", "BiasAdd",
                          "MaxPoolV2"})


RULES = {"SpaceToBatchND": _space_to_batch, "BatchToSpaceND": _batch_to_space}
