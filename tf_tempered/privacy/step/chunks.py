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
"""Stages 3–7 of the DP step on the whole batch, or chunk by chunk
(``EngineOptions.physical_batch_size``).

Each microbatch's clip factor c_m depends on its own gradient only, so the clipped sum
of a batch is the sum of its chunks' clipped sums, for chunks of whole microbatches:

    Σ_m c_m·g_m = Σ_chunks Σ_{m in chunk} c_m·g_m.

With ``physical_batch_size=P`` the batch goes through the forward and backward passes P
examples at a time, one chunk after the other (a ``tf.while_loop``); the noise is then
drawn once and the normaliser is the whole batch's, so the update, its sensitivity and
the ε are those of the batch, while the passes' peak memory is about a chunk's (what
Opacus' BatchMemoryManager and gradient accumulation give, inside one step).

Chunks are equal when an even split of the batch has at least P/2 examples per chunk
(static shapes: the handlers' paths are chosen for that size); otherwise the last chunk is
shorter (not under XLA, which needs static shapes: refused with the fix). The default,
``physical_batch_size="auto"``, chunks only a batch over the budgets of chunk_sizes.py
(its kept tensors, a native-loop RNN's time-step rows), in equal chunks of at least
AUTO_MIN_CHUNK examples, or, for a batch of unknown size, in chunks sized in the step.

>>> even_chunk_examples(300, 128), even_chunk_examples(256, 128), even_chunk_examples(257, 128)
(100, 128, None)
"""

import dataclasses
import math
from typing import Any, Optional

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.step.backward import backward
from tf_tempered.privacy.step.batch import Batch
from tf_tempered.privacy.step import chunk_sizes
from tf_tempered.privacy.step.clip_factors import clip_factors, fused_clip_factors
from tf_tempered.privacy.step.forward import record_forward
from tf_tempered.privacy.step.forward_checks import guarded
from tf_tempered.privacy.step.metrics import local_stats, update_compiled_metrics
from tf_tempered.privacy.step.norms import keep_layer_paths, layer_norms

__all__ = ["Passes", "clipped_passes", "even_chunk_examples", "AUTO"]

AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Passes:
    """What the forward and backward passes of a step left for the noise and the metrics.

    ``summed``: {variable_key: Σ_m c_m·g_m}; ``local_stats``: this replica's
    metrics.local_stats vector; ``total``: the summed microbatch losses (the noise is drawn
    after it); ``rows``: this replica's rows; ``y_pred``: the predictions, or None when the
    compiled metrics were already updated chunk by chunk.
    """

    summed: Any
    local_stats: Any
    total: Any
    rows: Any
    y_pred: Optional[Any]


def one_pass(model, state, plan, batch, losses=None):
    """The Passes of the whole ``batch`` at once (stages 3 to 7)."""
    forward = record_forward(model, batch, plan, losses=losses)
    static_rows = forward.losses.shape[0]
    rows = tf.shape(forward.losses)[0]
    layout, groups = backward(model, forward, plan,
                              static_rows if static_rows is not None else rows)
    layers = layer_norms(model, state, groups, layout, forward.recorder.norm_hooks)
    if plan.clipped_sum.fuses_layers:
        norm, finite, weights, layers = fused_clip_factors(layers, forward.num_microbatches,
                                                           plan.config.l2_norm_clip)
    else:
        norm, finite, weights = clip_factors(layers, forward.num_microbatches,
                                             plan.config.l2_norm_clip)
    keep_layer_paths(state, layers)
    summed = guarded(plan.clipped_sum.sum(forward, layers, weights, model.trainable_variables),
                     forward.whole_examples)
    return Passes(summed, local_stats(plan, batch, forward, norm, finite), forward.total, rows,
                  forward.y_pred)


def even_chunk_examples(examples, physical):
    """Examples per chunk of an even split of ``examples`` into chunks of at most
    ``physical``, if one has at least physical/2 per chunk; else None (a short last chunk)."""
    for count in range(math.ceil(examples / physical), examples + 1):
        size = examples // count
        if size * 2 < physical:
            return None
        if size * count == examples:
            return size
    return None


def clipped_passes(model, state, plan, batch, losses=None):
    """The Passes of one step: the whole batch, or chunk by chunk (module docstring)."""
    physical = plan.options.physical_batch_size
    if physical is None:
        return one_pass(model, state, plan, batch, losses)
    multiplicity = plan.multiplicity
    rows = _rows(batch)
    static = isinstance(rows, int)
    if physical == AUTO:
        return _auto_passes(model, state, plan, batch, losses, rows)
    _refuse_microbatches(plan)
    if static and rows <= physical * multiplicity:
        return one_pass(model, state, plan, batch, losses)
    chunk_examples = even_chunk_examples(rows // multiplicity, physical) if static else None
    if chunk_examples is None and plan.xla:
        raise ValueError(
            f"EngineOptions(physical_batch_size={physical}) with jit_compile=True needs "
            f"chunks of one static size, and the batch has "
            f"{rows if static else 'an unknown number of'} rows. Fix: a batch size that "
            f"splits into equal chunks of {-(-physical // 2)} to {physical} examples "
            "(tf.data: .batch(size, drop_remainder=True)), or jit_compile=False.")
    chunk_rows = (chunk_examples or physical) * multiplicity
    return _chunked(model, state, plan, batch, losses, rows, chunk_rows,
                    equal=chunk_examples is not None)


def _auto_passes(model, state, plan, batch, losses, rows):
    """physical_batch_size="auto": chunks only where they are known to pay (chunk_sizes.py),
    of whole examples, one example per microbatch; a batch of unknown size in chunks only
    if any batch that could be split (2·AUTO_MIN_CHUNK examples or more) is over budget.
    Never under XLA: its CPU backend ran the CIFAR-10 CNN's step in 4 chunks in 14.2 s,
    whole in 0.64 s (non-private 0.43 s; benchmarks/results/xla_chunks.md)."""
    multiplicity = plan.multiplicity
    if plan.config.num_microbatches is not None or plan.xla:
        return one_pass(model, state, plan, batch, losses)
    if not isinstance(rows, int):
        limit = chunk_sizes.auto_physical_batch_size(
            model, 2 * chunk_sizes.AUTO_MIN_CHUNK, multiplicity, plan.options)
        if limit is None:
            return one_pass(model, state, plan, batch, losses)
        return _chunked(model, state, plan, batch, losses, rows,
                        chunk_sizes.dynamic_chunk_rows(rows, limit, multiplicity), equal=False)
    examples = rows // multiplicity
    physical = chunk_sizes.auto_physical_batch_size(model, examples, multiplicity, plan.options)
    chunk_examples = physical and chunk_sizes.auto_chunk_examples(examples, physical)
    if not chunk_examples or chunk_examples * multiplicity >= rows:
        return one_pass(model, state, plan, batch, losses)
    return _chunked(model, state, plan, batch, losses, rows, chunk_examples * multiplicity,
                    equal=True)


def _refuse_microbatches(plan):
    if plan.config.num_microbatches is not None:
        raise ValueError(
            f"EngineOptions(physical_batch_size={plan.options.physical_batch_size}) splits "
            f"the batch into chunks of whole examples, and num_microbatches="
            f"{plan.config.num_microbatches} groups examples into microbatches that a chunk "
            "could split. Fix: num_microbatches=None (one example per microbatch), or "
            "physical_batch_size=None.")


def _rows(batch):
    first = tf.nest.flatten(batch.x)[0]
    return first.shape[0] if first.shape[0] is not None else tf.shape(first)[0]


def _chunked(model, state, plan, batch, losses, rows, chunk_rows, *, equal):
    """The Passes of ``batch`` in chunks of ``chunk_rows`` rows (the last may be shorter
    unless ``equal``), one after the other in a while loop."""
    variables = model.trainable_variables
    count = -(-rows // chunk_rows)  # a Python int or a scalar tensor
    traced = {}  # the length of the stats vector, known once the body is traced

    def body(i, sums, total, num_rows, stats):
        start = i * chunk_rows
        size = chunk_rows if equal else tf.minimum(chunk_rows, rows - start)
        chunk = _slice_batch(batch, start, size)
        passes = one_pass(model, state, plan, chunk, losses)
        traced["stats"] = passes.local_stats.shape[0]
        if losses is None:  # the model's own step: its compiled metrics, chunk by chunk
            update_compiled_metrics(model, chunk, passes.y_pred, in_loop=True)
        sums = [s + tf.cast(passes.summed[keras_bridge.variable_key(v)], s.dtype)
                if keras_bridge.variable_key(v) in passes.summed else s
                for s, v in zip(sums, variables)]
        return (i + 1, sums, total + passes.total, num_rows + passes.rows,
                stats.write(i, passes.local_stats))

    start = (tf.constant(0), [tf.zeros(v.shape, v.dtype) for v in variables],
             tf.constant(0.0), tf.constant(0),
             tf.TensorArray(tf.float32, size=count, element_shape=tf.TensorShape([None])))
    # One chunk at a time: with overlapping iterations two chunks' activations would be
    # held at once, which is the memory the chunks are there to save.
    _, sums, total, num_rows, stats = tf.while_loop(
        lambda i, *_: i < count, body, start, maximum_iterations=count, parallel_iterations=1)
    summed = {keras_bridge.variable_key(v): s for v, s in zip(variables, sums)}
    stats = tf.ensure_shape(tf.reduce_sum(stats.stack(), 0), [traced["stats"]])
    return Passes(summed, stats, total, num_rows, None)


def _slice_batch(batch, start, size):
    """The rows [start, start + size) of every per-row tensor of ``batch``."""
    def rows_of(t):
        if not isinstance(t, tf.Tensor) or t.shape.rank == 0:
            return t
        if not isinstance(size, int):
            return t[start:start + size]
        # A constant size: a static shape, and a dynamic slice XLA compiles.
        begin = tf.stack([start] + [0] * (t.shape.rank - 1))
        return tf.slice(t, begin, [size] + [-1 if d is None else d for d in t.shape[1:]])

    def structure(s):
        return None if s is None else tf.nest.map_structure(rows_of, s)

    return Batch(structure(batch.x), structure(batch.y), structure(batch.loss_weight),
                 structure(batch.user_weight), structure(batch.poisson_mask), batch.normalizer)
