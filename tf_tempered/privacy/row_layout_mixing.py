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
"""Ops that mix the batch's examples, or carry its axis through a product: reductions,
cumulative ops and softmaxes over the batch's axis, matmuls and einsums that contract it or
pair two examples, batch normalization in training mode, linear algebra and Fourier
transforms over it, and Python functions (whose work is not known) on the batch's data
(rules of row_layout's walk)."""

from tf_tempered.privacy.row_layout_marks import (MIXED, REARRANGED, UNKNOWN, is_picked,
                                                  normalized_axis, one_layout, same_axes,
                                                  static_values)

__all__ = ["RULES"]


def _einsum(op, layouts):
    inputs, output = _without_ellipsis(op)
    if any(found is not None and not isinstance(found, int) for found in layouts):
        return _einsum_of_marked_rows(inputs, output, layouts)
    letters = set()
    for names, layout in zip(inputs, layouts):
        if layout is None:
            continue
        letters.add(names[layout])
    if any(letter not in output for letter in letters) or len(letters) > 1:
        return MIXED  # the batch's letter summed over, or pairs of examples
    return output.index(letters.pop())


def _einsum_of_marked_rows(inputs, output, layouts):
    """An einsum of rearranged or picked rows (which became UNKNOWN here, so a mixup with the
    reversed batch through an einsum trained; probe H3): picked rows stay that example's;
    rearranged rows stay rearranged unless their first axis is summed over (MIXED)."""
    layout = one_layout(layouts)
    if layout is REARRANGED and any(found is REARRANGED and names[0] not in output
                                    for names, found in zip(inputs, layouts)):
        return MIXED
    return layout


def _without_ellipsis(op):
    """The equation's input and output letters, "..." spelled out as the axes it stands for
    (right-aligned, as einsum broadcasts them)."""
    inputs, output = op.get_attr("equation").decode().replace(" ", "").split("->")
    inputs = inputs.split(",")
    spare = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in "".join(inputs) + output]
    widest = 0
    for i, (names, tensor) in enumerate(zip(inputs, op.inputs)):
        if "..." in names:
            count = tensor.shape.rank - (len(names) - 3)
            widest = max(widest, count)
            inputs[i] = names.replace("...", "".join(spare[len(spare) - count:]))
    output = output.replace("...", "".join(spare[len(spare) - widest:]))
    return inputs, output


def _matmul(op, layouts):
    """[m, k]·[k, n]: the batch on a contracted axis, or on both free axes (pairs of
    examples), mixes examples; on one free axis it is that output axis."""
    x = (0, 1) if op.get_attr("transpose_a") else (1, 0)  # (contracted, free) axes
    y = (1, 0) if op.get_attr("transpose_b") else (0, 1)
    return _product(op, layouts, (x, y), ranks=(2, 2))


def _batch_matmul(op, layouts):
    ranks = [t.shape.rank for t in op.inputs[:2]]
    if None in ranks or op.outputs[0].shape.rank is None:
        return UNKNOWN
    (rx, ry) = ranks
    x = (rx - 2, rx - 1) if op.get_attr("adj_x") else (rx - 1, rx - 2)
    y = (ry - 1, ry - 2) if op.get_attr("adj_y") else (ry - 2, ry - 1)
    return _product(op, layouts, (x, y), ranks)


def _product(op, layouts, axes, ranks):
    """Where the batch goes through a (batched) matrix product; ``axes``: (contracted,
    free) axis of each operand."""
    rank, found = op.outputs[0].shape.rank, set()
    for layout, (contracted, free), r, out in zip(layouts, axes, ranks, (-2, -1)):
        if layout is None:
            continue
        if not isinstance(layout, int):
            return layout
        if layout == contracted:
            return MIXED
        found.add(rank + out if layout == free else layout + rank - r)  # free, or batch dim
    if found == {rank - 2, rank - 1}:
        return MIXED  # [.., B, B]: pairs of examples
    return found.pop() if len(found) == 1 else UNKNOWN


def _reduction(op, layouts):
    layout, rank = layouts[0], op.inputs[0].shape.rank
    if not isinstance(layout, int) and layout is not REARRANGED:
        return layout
    axes = [normalized_axis(a, rank) for a in static_values(op.inputs[1])]
    if layout is REARRANGED:  # rows moved across examples on the first axis, in practice
        return MIXED if 0 in axes else layout
    if layout in axes:
        return MIXED  # a statistic of the batch
    return layout if op.get_attr("keep_dims") else layout - sum(a < layout for a in axes)


def _along_one_axis(drops):
    def rule(op, layouts):
        layout = layouts[0]
        if not isinstance(layout, int):
            return layout
        axis = normalized_axis(static_values(op.inputs[1])[0], op.inputs[0].shape.rank)
        if axis == layout:
            return MIXED
        return layout - 1 if drops and axis < layout else layout
    return rule


def _last_axis(op, layouts):
    layout = layouts[0]
    if isinstance(layout, int) and layout == op.inputs[0].shape.rank - 1:
        return MIXED  # a softmax over the examples
    return same_axes(op, layouts)


def _segments(op, layouts):
    """Segment sums and means: rows of the first axis (the examples') summed by segment;
    rows of one example picked, that example's (rearranged rows were UNKNOWN here)."""
    if is_picked(layouts[0]) and all(found is None or found == layouts[0]
                                     for found in layouts[1:]):
        return layouts[0]
    return MIXED if layouts[0] in (0, UNKNOWN, REARRANGED) else UNKNOWN


def _windows(op, layouts):
    """Pooling and convolutions (NHWC): windows over the axes after the first, and a
    convolution's sum over the channels: the examples anywhere but first are mixed."""
    if UNKNOWN in layouts:
        return UNKNOWN
    layout = one_layout(layouts)  # the input's with a kernel's (picked and batch rows: MIXED)
    if not isinstance(layout, int):
        return layout  # rows rearranged or picked stay so (they were UNKNOWN: probe H3)
    if any(found is not None for found in layouts[1:]):
        return MIXED  # a kernel from the batch's data, for every example
    return MIXED if layout != 0 else 0


def _last_axes(count):
    """Ops on the last ``count`` axes of each input (a QR or an inverse on the last two, an
    FFT on the last one): the examples among them are transformed together."""
    def rule(op, layouts):
        for tensor, layout in zip(op.inputs, layouts):
            if isinstance(layout, int) and layout >= tensor.shape.rank - count:
                return MIXED
        layout = one_layout(layouts)
        if layout is REARRANGED:  # (UNKNOWN before: probe H3)
            return MIXED if any(found is REARRANGED and tensor.shape.rank <= count
                                for tensor, found in zip(op.inputs, layouts)) else REARRANGED
        return layout if isinstance(layout, int) or is_picked(layout) else UNKNOWN
    return rule


def _crossentropy(op, layouts):
    """tf.nn's softmax crossentropy ops ([rows, classes] logits, labels): one loss per
    row; the examples on the classes' axis are mixed by the softmax."""
    layout = one_layout(layouts)
    if not isinstance(layout, int):
        return layout
    return MIXED if layout == op.inputs[0].shape.rank - 1 else layout


def _bincount(op, layouts):
    """tf.math.bincount: per row of a [rows, n] input (``axis=-1``), else over every entry
    (the batch's counts together)."""
    layout = layouts[0]
    if not isinstance(layout, int):
        return layout
    return 0 if layout == 0 and op.inputs[0].shape.rank == 2 else MIXED


def _opaque(op, layouts):
    """tf.py_function and tf.numpy_function: what they compute from the rows is not known
    (from one example's rows, in tf.map_fn's body: that example's)."""
    layout = one_layout(layouts)
    return layout if is_picked(layout) else MIXED


def _whole_sum(op, layouts):
    """tf.nn.l2_loss: one sum over every axis, the batch's (one example's rows: its own)."""
    return layouts[0] if is_picked(layouts[0]) else MIXED


def _ctc(op, layouts):
    """tf.nn.ctc_loss's ops: each example's labels given by a sparse tensor's rows (values
    gathered from the labels where they are set, which the walk sees as rearranged), one
    loss per example: not followed (UNKNOWN), as the sparse labels' rows are read by their
    indices."""
    return UNKNOWN


def _fused_batch_norm(op, layouts):
    """Statistics over every axis but the channels': the examples on the channel axis are
    normalized each on its own (tf-keras' LayerNormalization), elsewhere together."""
    layout = layouts[0]
    if not isinstance(layout, int):
        return UNKNOWN
    channels = 1 if op.get_attr("data_format").decode().startswith("NC") else (
        op.inputs[0].shape.rank - 1)
    if op.get_attr("is_training") and layout != channels:
        return MIXED  # normalized with the batch's statistics
    return layout


RULES = {
    "Einsum": _einsum, "MatMul": _matmul, "BatchMatMulV2": _batch_matmul,
    "BatchMatMulV3": _batch_matmul,
    **{name: _reduction for name in ("Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
                                     "EuclideanNorm")},
    "ArgMax": _along_one_axis(drops=True), "ArgMin": _along_one_axis(drops=True),
    **{name: _along_one_axis(drops=False) for name in ("Cumsum", "Cumprod",
                                                       "CumulativeLogsumexp")},
    "Softmax": _last_axis, "LogSoftmax": _last_axis, "L2Loss": _whole_sum,
    "TopKV2": _last_axis, "TopK": _last_axis,  # tf.sort, tf.argsort and top_k, on the last axis
    **{name: _segments for name in ("SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin",
                                     "SegmentProd", "UnsortedSegmentSum", "UnsortedSegmentMax",
                                     "UnsortedSegmentMin", "UnsortedSegmentProd",
                                     "SparseSegmentSum", "SparseSegmentMean",
                                     "SparseSegmentSqrtN")},
    **{name: _windows for name in ("AvgPool", "MaxPool", "MaxPoolV2", "AvgPool3D", "MaxPool3D",
                                   "Conv1D", "Conv2D", "Conv3D", "DepthwiseConv2dNative")},
    **{name: _fused_batch_norm for name in ("FusedBatchNorm", "FusedBatchNormV2",
                                            "FusedBatchNormV3")},
    "NthElement": _last_axis, "DenseBincount": _bincount, "Bincount": _bincount,
    "SparseSoftmaxCrossEntropyWithLogits": _crossentropy,
    "SoftmaxCrossEntropyWithLogits": _crossentropy,
    **{name: _last_axes(2) for name in (
        "Qr", "Svd", "MatrixInverse", "Cholesky", "MatrixDeterminant", "LogMatrixDeterminant",
        "SelfAdjointEigV2", "Eig", "MatrixSolve", "MatrixTriangularSolve", "MatrixSolveLs",
        "MatrixExponential", "MatrixLogarithm", "MatrixSquareRoot", "Lu",
        "FFT2D", "IFFT2D", "RFFT2D", "IRFFT2D")},
    **{name: _last_axes(1) for name in ("FFT", "IFFT", "RFFT", "IRFFT")},
    **{name: _last_axes(3) for name in ("FFT3D", "IFFT3D", "RFFT3D", "IRFFT3D")},
    **{name: _opaque for name in ("EagerPyFunc", "PyFunc", "PyFuncStateless")},
    "CTCLoss": _ctc, "CTCLossV2": _ctc,
}
