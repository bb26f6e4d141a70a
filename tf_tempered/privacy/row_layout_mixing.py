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
pair two examples, batch normalization in training mode (rules of row_layout's walk)."""

from tf_tempered.privacy.row_layout_ops import (MIXED, UNKNOWN, normalized_axis, same_axes,
                                                static_values)

__all__ = ["RULES"]


def _einsum(op, layouts):
    inputs, output = op.get_attr("equation").decode().replace(" ", "").split("->")
    letters = set()
    for names, layout in zip(inputs.split(","), layouts):
        if layout is None:
            continue
        if not isinstance(layout, int) or "." in names:
            return UNKNOWN
        letters.add(names[layout])
    if any(letter not in output for letter in letters) or len(letters) > 1:
        return MIXED  # the batch's letter summed over, or pairs of examples
    return output.index(letters.pop())


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
    if not isinstance(layout, int):
        return layout
    axes = [normalized_axis(a, rank) for a in static_values(op.inputs[1])]
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


def _fused_batch_norm(op, layouts):
    if op.get_attr("is_training") and layouts[0] is not None:
        return MIXED  # normalized with the batch's statistics
    return UNKNOWN


RULES = {
    "Einsum": _einsum, "MatMul": _matmul, "BatchMatMulV2": _batch_matmul,
    "BatchMatMulV3": _batch_matmul,
    **{name: _reduction for name in ("Sum", "Mean", "Max", "Min", "Prod", "All", "Any",
                                     "EuclideanNorm")},
    "ArgMax": _along_one_axis(drops=True), "ArgMin": _along_one_axis(drops=True),
    **{name: _along_one_axis(drops=False) for name in ("Cumsum", "Cumprod",
                                                       "CumulativeLogsumexp")},
    "Softmax": _last_axis, "LogSoftmax": _last_axis, "L2Loss": lambda op, layouts: MIXED,
    **{name: _fused_batch_norm for name in ("FusedBatchNorm", "FusedBatchNormV2",
                                            "FusedBatchNormV3")},
}
