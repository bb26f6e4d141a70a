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
"""Whether each recorded layer call sees the batch's examples on its first axis.

The handlers split a layer's recorded input and output gradient into the batch's
examples along the first axis ([B, ...] or, after a reshape, [B·k, ...]). A layer called
on a tensor that is not the batch's (keras.io's position embedding on ``tf.range(maxlen)``,
a ViT's positions ``[1, P]``) has one output for every example, broadcast when it is
added to the batch: its output gradient is the sum over the batch, and no split of it is
an example's. Such a call is refused while the step traces, with the fix, when

* its input does not depend on the batch's values (``Shape`` ops aside: a length read from
  the batch is no data of it) and its first axis is not the batch's: a static length where
  the batch's is unknown, or another static length. A tensor broadcast to the batch's shape
  (``tf.broadcast_to(positions, tf.shape(token_ids))``) passes;
* or, statically, its first axis is not a multiple of the batch;
* or its rows were rearranged across examples (``tf.concat([a, b], 0)`` of two batch
  tensors, a tile, a time-major transpose: ``row_layout``), which keeps the first axis a
  multiple of the batch.

Positions ``tf.range(maxlen)`` are refused also when maxlen equals the batch's length. Not
seen: another tensor of no example's data whose length equals the batch's by chance (with
static shapes a broadcast and such a tensor look alike). Eagerly (``run_eagerly=True``)
there is no graph to read: the eager step's passes run as a function traced each step
(step/eager_passes).

>>> import tensorflow as tf
>>> @tf.function
... def depends(x):
...     positions = tf.range(tf.shape(x)[1])
...     return [_depends_on(t, {x.op}, {}) for t in (positions, tf.range(3), x * 2)]
>>> [bool(v) for v in depends(tf.ones((2, 3)))]
[False, False, True]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import row_layout
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["refuse_calls_off_the_batch", "refuse_mixed_losses", "whole_examples_per_row"]


def refuse_calls_off_the_batch(records, x, rows):
    """Raises UnsupportedLayerError for a recorded call whose input is not the batch's, or
    whose rows were rearranged across examples (module docstring). ``x``: the model's
    inputs; ``rows``: the batch's static length or None."""
    batch = _batch_tensors(x)
    if tf.executing_eagerly() or not batch:
        return None
    graph, batch_ops, values = batch[0].graph, {t.op for t in batch}, {}
    # A registered layer's outputs hold the examples on axis 0 when its inputs do, which is
    # checked for that call itself.
    sources = batch_ops | _record_output_ops(records, graph)
    layouts = {row_layout.BATCH_ROWS: rows, row_layout.ROWS_TO_CHECK: []}
    for record in records:
        inputs = [t for t in tf.nest.flatten(record.inputs)
                  if isinstance(t, tf.Tensor) and getattr(t, "graph", None) is graph
                  and t.shape.rank not in (None, 0)]
        if not inputs:
            continue  # another graph (a loop's body): not seen
        _refuse_rows_off_the_batch(record, inputs[0], rows, batch_ops, values)
        for tensor in inputs:
            layout = row_layout.batch_axis(tensor, sources, layouts)
            if layout is row_layout.MIXED:
                raise UnsupportedLayerError(_mixed_message(
                    f"Layer {record.layer.name!r} ({type(record.layer).__name__}) is called "
                    "on"))
            if (row_layout.is_rearranged(layout) or row_layout.is_picked(layout)
                    or (isinstance(layout, int) and layout)):
                raise UnsupportedLayerError(_rearranged_message(record.layer, layout))
    return sources, layouts


def refuse_mixed_losses(losses, batch_tensors, walked):
    """Raises UnsupportedLayerError when the per-example losses (rows of ``losses``) were
    computed from several examples: a layer without weights after the last recorded call,
    or the loss itself, mixed the batch (a batch mean subtracted, a loss pulling each
    example to the batch's centroid), or from rows rearranged across examples. ``walked``:
    (sources, layouts) returned by refuse_calls_off_the_batch for the same step, or None."""
    if tf.executing_eagerly() or not hasattr(losses, "op") or walked is None:
        return
    sources, layouts = walked
    sources = sources | {t.op for t in _batch_tensors(batch_tensors)
                         if getattr(t, "graph", None) is losses.graph}
    layout = row_layout.batch_axis(losses, sources, layouts)
    if layout is row_layout.MIXED:
        raise UnsupportedLayerError(_mixed_message("The per-example losses are computed from"))
    if row_layout.is_rearranged(layout):
        # Rows moved across examples and then combined among themselves stay REARRANGED
        # (a reversed batch minus its first row, pairs of its rows): 1.5-6.1 C (probe P2, F4).
        raise UnsupportedLayerError(
            "The per-example losses are computed from rows of the batch's examples rearranged "
            "(reversed, rolled, gathered or tiled across examples, or a dilated convolution's "
            "blocks) without each example's own labels: a loss row may then hold several "
            "examples' values, and no example's clipped gradient bounds what it changes. Fix: "
            "compute each example's loss from its own row of the model's output, in order.")


def whole_examples_per_row(walked, losses):
    """A bool tensor, True when every reshape the walks of ``walked`` (as
    refuse_calls_off_the_batch returns) could not check while tracing, the batch's length
    unknown, left its rows holding whole examples: their axis a multiple of the batch's length
    (``losses``' rows). [B, F] -> [B/2, 2, F] merges two examples a row, and a statistic of
    each row then mixes them (2.2-4.9 C; probe H3). None when there is nothing to check."""
    to_check = [] if walked is None else walked[1].get(row_layout.ROWS_TO_CHECK) or []
    to_check = [(t, axis) for t, axis in to_check if t.graph is losses.graph]
    if not to_check:
        return None
    examples = tf.maximum(tf.shape(losses, out_type=tf.int64)[0], 1)
    return tf.reduce_all(tf.stack([
        tf.equal(tf.shape(t, out_type=tf.int64)[axis] % examples, 0) for t, axis in to_check]))


def _batch_tensors(data):
    """The traced tensors of ``data`` holding the examples on their first axis, a sparse
    tensor's indices and values among them (a sparse input left every check out: a batch
    centering after tf.sparse.to_dense trained; probe H3)."""
    found = []
    for t in tf.nest.flatten(data):
        parts = [t.indices, t.values] if isinstance(t, tf.SparseTensor) else [t]
        found += [p for p in parts if isinstance(p, tf.Tensor) and hasattr(p, "op")]
    return found


def _refuse_rows_off_the_batch(record, first, rows, batch_ops, values):
    length = first.shape[0]
    if length is not None and rows and length % rows:
        raise UnsupportedLayerError(_message(record.layer, f"{length} rows for a batch of "
                                             f"{rows}"))
    if (length is None or (length == rows and not _is_a_range(first))
            or _depends_on(first, batch_ops, values)):
        return  # the batch's length, or its values
    raise UnsupportedLayerError(_message(
        record.layer, f"an input of {length} rows that does not come from the batch"))


def _record_output_ops(records, graph):
    """Outputs of recorded calls whose handler's math is per example (a registered layer's);
    the walk goes through the calls of custom layers (the generic VJP, a custom recurrent
    cell), whose own ops may mix examples (a hand-written batch normalization)."""
    return {t.op for record in records if not _runs_own_call(record)
            for t in tf.nest.flatten(record.output)
            if isinstance(t, tf.Tensor) and getattr(t, "graph", None) is graph}


def _runs_own_call(record):
    return record.kind == "generic" or getattr(record.handler, "vjp_of_own_call", False)


def _is_a_range(tensor):
    """Whether ``tensor`` is a tf.range (through identities and casts): positions, which
    have the batch's static length only by chance."""
    return row_layout.source_of(tensor).op.type == "Range"


def _message(layer, what):
    return (f"Layer {layer.name!r} ({type(layer).__name__}) is called on {what}: its rows "
            "are not the batch's examples, so its output gradient (summed over the batch where "
            "the output is broadcast to it) cannot be split per example, and every example's "
            "clipped gradient would be wrong. Fix: call it on a tensor with the batch's "
            "examples on the first axis, e.g. positions broadcast to the batch "
            "(tf.broadcast_to(tf.range(length), tf.shape(token_ids))) before a position "
            "Embedding, or keep the position weights in a layer of your own that adds them "
            "to its input (add_weight of shape [length, dim]).")


def _rearranged_message(layer, layout):
    what = ("rows of the batch's examples rearranged (tf.concat of batch tensors on axis 0, "
            "a tile, reverse, roll or gather of the batch's rows, a tf.gather_nd or scatter "
            "that does not keep each example's row in place, or rows unstacked and stacked, "
            "or written to a TensorArray, in another order)"
            if layout is row_layout.REARRANGED else
            "the blocks of tf.space_to_batch (a dilated convolution's inside, before "
            "tf.batch_to_space puts the examples back)"
            if row_layout.is_rearranged(layout) else
            "rows of some of the batch's examples (picked by an index, a part of tf.split, "
            "or rows taken by a tf.gather_nd whose positions repeat examples), each handled as "
            "an example of its own"
            if row_layout.is_picked(layout) else
            f"a tensor holding the batch's examples on axis {layout}, not on the first axis "
            "(a transpose to time-major, or a stack)")
    return (f"Layer {layer.name!r} ({type(layer).__name__}) is called on {what}: its handler "
            "splits the first axis into the batch's examples in order, so every example's "
            "clipped gradient would be wrong. Fix: call the layer once per part instead of on "
            "their concatenation (encoder(a) and encoder(b), not encoder(tf.concat([a, b], "
            "0))), keep the batch's examples on the first axis (transpose back before the "
            "layer), and index each example's own row (tf.gather(..., batch_dims=1), or "
            "tf.gather_nd with tf.stack([tf.range(n), positions], 1)).")


def _mixed_message(subject):
    return (f"{subject} values computed from several examples of the batch (a mean, sum, max "
            "or softmax over the batch's axis, a matmul contracting it, a matrix of pairs of "
            "examples, one example's row used with the others' as in t - t[0], a running "
            "total over the examples in a loop, or a tf.py_function whose work on the rows is "
            "not known): one example then changes every example's gradient, and clipping "
            "each one no longer bounds what it changes, so no ε would hold. Fix: compute "
            "every statistic per example (over axes 1 and up, e.g. LayerNormalization instead "
            "of subtracting the batch mean), take statistics from public data (a "
            "Normalization layer adapted on public data, in make_private(public_layers=...)), "
            "and use a loss of each example's own prediction and label.")


def _depends_on(tensor, batch_ops, memo):
    """Whether ``tensor`` depends on the values of ``batch_ops``' outputs (a length read
    from the batch is no data of it). ``memo``: row_layout's, for these sources only."""
    return row_layout.batch_axis(tensor, batch_ops, memo) is not None
