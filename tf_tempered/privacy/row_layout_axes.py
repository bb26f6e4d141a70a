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
"""Rules of row_layout's walk for ops that add, drop or move axes of each example: a one-hot
encoding, depth-to-space and space-to-depth, matrix diagonals, an order statistic over the
last axis, a histogram, a sparse batch made dense. Without them the walk claimed nothing
after such an op (UNKNOWN), and a batch mean or a softmax over the batch after it trained:
one replaced example moved the clipped sum 2.5-6.9 C (probe H2, F1).

>>> import tensorflow as tf
>>> from tf_tempered.privacy.row_layout import batch_axis as batch_axis_of
>>> found = []
>>> @tf.function
... def where(ids, images):
...     found.extend(batch_axis_of(t, {ids.op, images.op}) for t in (
...         tf.one_hot(ids, 4), tf.one_hot(ids, 4, axis=0), tf.nn.depth_to_space(images, 2),
...         tf.linalg.diag_part(images), tf.linalg.diag(images[:, 0, 0, 0]),
...         tf.histogram_fixed_width(images, [0.0, 1.0])))
>>> where(tf.zeros((3, 5), tf.int32), tf.ones((3, 2, 2, 4)))
>>> found
[0, 1, 0, 0, REARRANGED, MIXED]
"""

from tf_tempered.privacy.row_layout_marks import MIXED, REARRANGED, normalized_axis

__all__ = ["RULES"]


def _settings_of_the_batch(layouts):
    """Whether an input after the first (a depth, an on-value, a padding value, n) depends on
    the batch: one example's value then sets every example's output (old code: refused)."""
    return any(found is not None for found in layouts[1:])


def _one_hot(op, layouts):
    """A new axis of the depth at ``axis`` (-1: last): the batch axis moves past it."""
    layout = layouts[0]
    if _settings_of_the_batch(layouts):
        return MIXED  # a depth or value of the batch's data
    if not isinstance(layout, int):
        return layout
    axis = normalized_axis(op.get_attr("axis"), op.outputs[0].shape.rank)
    return layout + 1 if axis <= layout else layout


def _spatial_blocks(op, layouts):
    """DepthToSpace / SpaceToDepth move values between one example's spatial and channel
    axes (NHWC and NCHW alike: the batch stays first)."""
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    return 0 if layout == 0 else REARRANGED


def _diagonal_rule(diagonal_axes):
    """The rule of an op taking or making a diagonal over the last ``diagonal_axes`` axes:
    tf.linalg.diag_part ([..., M, N] -> [..., min(M, N)], a band of k diagonals one axis
    more) takes 2, tf.linalg.diag ([..., N] -> [..., N, N]) 1. Leading axes are kept; the
    examples on the diagonal's axes are rearranged (each row holds one example's value at its
    own position)."""
    def rule(op, layouts):
        layout = layouts[0]
        if _settings_of_the_batch(layouts):
            return MIXED  # a diagonal index k or a padding value of the batch's data
        if not isinstance(layout, int):
            return layout
        return layout if layout < op.inputs[0].shape.rank - diagonal_axes else REARRANGED
    return rule


_diagonal_part, _diagonal = _diagonal_rule(2), _diagonal_rule(1)


def _last_axis_dropped(op, layouts):
    """tf.math.top_k's n-th element over the last axis: an order statistic of the examples
    when they lie along it."""
    layout = layouts[0]
    if _settings_of_the_batch(layouts):
        return MIXED  # n read from the batch's data
    if not isinstance(layout, int):
        return layout
    return MIXED if layout == op.inputs[0].shape.rank - 1 else layout


def _statistic_of_all(op, layouts):
    """A histogram of every value: one count over the batch."""
    return MIXED


def _sparse_to_dense(op, layouts):
    """tf.sparse.to_dense of a batch's sparse tensor: each entry's row is its index's first
    column, the example's; its values' order does not matter."""
    indices, values = layouts[0], layouts[2]
    if any(isinstance(found, int) and found for found in (indices, values)):
        return REARRANGED  # entries indexed along another axis
    if (isinstance(indices, int) or indices is None) and (isinstance(values, int)
                                                          or values is None):
        return 0
    return MIXED if MIXED in (indices, values) else REARRANGED


RULES = {
    "SparseToDense": _sparse_to_dense,
    "OneHot": _one_hot,
    "DepthToSpace": _spatial_blocks, "SpaceToDepth": _spatial_blocks,
    "MatrixDiagPart": _diagonal_part, "MatrixDiagPartV2": _diagonal_part,
    "MatrixDiagPartV3": _diagonal_part,
    "MatrixDiag": _diagonal, "MatrixDiagV2": _diagonal, "MatrixDiagV3": _diagonal,
    "NthElement": _last_axis_dropped, "HistogramFixedWidth": _statistic_of_all,
}
