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
"""Which path gives a Dense/Conv2D layer's per-microbatch gradient norms.

`choose` fills record.cache with the choice; clipping.py computes it:

* cache["native"]: the native op (Conv2D on CPU, native.py), with or without
  the gradients themselves;
* cache["depthwise"]: TF ops, per-example kernel gradients from a depthwise-conv
  backprop (undilated Conv2D with few channel pairs);
* cache["materialize"]: True (per-microbatch gradients kept: a matrix-vector
  clipped sum), False (ghost norm or native norms only: a book-keeping clipped
  sum), or a boolean tensor decided per step when the microbatch count is not
  known while tracing.

The thresholds below were measured on this project's 2-core CPU machine. M is
the number of microbatches, E the examples per microbatch (None when the batch
size is not static), "rows" the rows a_r of one microbatch (E × output pixels).
"""

import numpy as np

from tf_tempered.privacy import native

__all__ = ["choose", "fits", "input_width", "static_rows"]

# A Dense/Conv2D layer's per-microbatch gradients are materialized (one batched
# matmul, then a cheap norm and a matrix-vector clipped sum that needs nothing
# after the clip factors are known) unless they would take more than this many
# bytes; then the ghost norm and the book-keeping sum (no per-example tensor of
# the weights' size) keep memory at the size of the activations.
_MATERIALIZE_MAX_BYTES = 64 * 2**20

# Below this many (input channel, output channel) pairs a Conv2D's per-example
# kernel gradients come from one depthwise-conv backprop (batch folded into
# channels), which on CPU is several times faster than extracting patches.
_DEPTHWISE_MAX_CHANNEL_PAIRS = 64

# Tests set this to "ghost" or "materialize" to exercise one TF-ops strategy
# everywhere (the native op is then not used), or to "native".
_FORCED_STRATEGY = None

# Tests set this to False to exercise the TF-ops paths the engine falls back on
# where the native op cannot be built.
_USE_NATIVE = True

# Tiny Gram matrices run far below the machine's speed, so for the choice between
# the native op and a ghost norm a microbatch counts at least this many rows
# (measured on CPU, batch 256: MNIST conv2, 16 rows, native 0.5 ms vs ghost
# 1.2-1.9 ms; a CIFAR-10 conv with 64 rows and 576x128 kernel, native 21 ms vs
# ghost 12 ms).
_NATIVE_MIN_GHOST_ROWS = 32

# With the native op, a Conv2D with at least this many output rows per
# microbatch has its per-microbatch gradients materialized (memory permitting);
# fewer rows make the book-keeping sum cheaper (measured on CPU, MNIST CNN,
# batch 256: conv1's 196 rows materialized and conv2's 16 not, 1.16-1.21x the
# non-private step; conv2 materialized too, 1.22-1.23x; neither, 1.26-1.30x).
_NATIVE_MATERIALIZE_MIN_ROWS = 64


def choose(record, num_microbatches, examples_per_microbatch):
    """Fills record.cache["native"], ["depthwise"] and ["materialize"]; returns the rows per microbatch."""
    cache, layer = record.cache, record.layer
    g_rows = static_rows(record.grad_output, examples_per_microbatch)
    cache["native"] = _use_native(record, g_rows)
    cache["depthwise"] = False
    if cache["native"]:
        # Materialized gradients (for a matrix-vector clipped sum) cost memory
        # traffic; the book-keeping sum instead costs the batch's filter gradient,
        # rows·d_in·d_out per microbatch: worth avoiding only for many rows.
        cache["materialize"] = (g_rows >= _NATIVE_MATERIALIZE_MIN_ROWS
                                and fits(record, num_microbatches))
    elif record.kind == "conv2d" and _FORCED_STRATEGY is None and (
            record.inputs.shape[-1] * layer.filters <= _DEPTHWISE_MAX_CHANNEL_PAIRS
            and tuple(layer.dilation_rate) == (1, 1)):
        # Not for dilated convolutions: TF 2.21's CPU depthwise backprop-filter
        # ignores `dilations` eagerly (wrong per-example gradients) and fails in
        # graphs (oneDNN: AbortedError; without: InvalidArgumentError).
        cache["depthwise"] = True
        cache["materialize"] = True
    else:
        _choose_tf_ops(record, num_microbatches, examples_per_microbatch, g_rows)
    return g_rows


def _use_native(record, g_rows):
    """Whether the native op gives this Conv2D's norms (and maybe its gradients)."""
    if (record.kind != "conv2d" or not _USE_NATIVE
            or _FORCED_STRATEGY in ("ghost", "materialize")):
        return False
    if not native.supports(record):
        return False
    if _FORCED_STRATEGY == "native":
        return True
    # Its cost per microbatch is rows·d_in·d_out multiply-adds, the ghost norm's rows²·(d_in + d_out).
    d_in, d_out = input_width(record), record.grad_output.shape[-1]
    return d_in * d_out <= max(g_rows, _NATIVE_MIN_GHOST_ROWS) * (d_in + d_out)


def fits(record, num_microbatches):
    """Whether per-microbatch kernel gradients fit in _MATERIALIZE_MAX_BYTES (a tensor if M is)."""
    g = record.grad_output
    return num_microbatches * (input_width(record) * g.shape[-1] * g.dtype.size) <= (
        _MATERIALIZE_MAX_BYTES)


def _choose_tf_ops(record, num_microbatches, examples_per_microbatch, g_rows):
    """Ghost norm or materialized gradients (TF ops): cache["materialize"]."""
    cache, g = record.cache, record.grad_output
    d_in, d_out = input_width(record), g.shape[-1]
    # Per microbatch the ghost norm costs rows²·(d_in + d_out) multiply-adds and
    # materializing rows·d_in·d_out: take the cheaper. Unknown rows (dynamic
    # batch, fixed microbatch count) make the ghost cost unbounded: materialize.
    if _FORCED_STRATEGY:
        cache["materialize"] = _FORCED_STRATEGY == "materialize"
    elif examples_per_microbatch is None:
        cache["materialize"] = True  # num_microbatches is then a static count
    else:
        cheaper = d_in * d_out <= g_rows * (d_in + d_out)
        # A tensor when the microbatch count is not static: decided per step.
        cache["materialize"] = cheaper and fits(record, num_microbatches)


def input_width(record):
    """d_in: the width of a row a_r (kh·kw·cin for a Conv2D)."""
    if record.kind == "conv2d":
        kh, kw = record.layer.kernel_size
        return kh * kw * record.inputs.shape[-1]
    return record.inputs.shape[-1]


def static_rows(t, examples_per_microbatch):
    """Rows per microbatch of a recorded [B, ..., d] tensor (per example when E is None)."""
    per_example = int(np.prod(t.shape[1:-1])) if len(t.shape) > 2 else 1
    return per_example * (examples_per_microbatch or 1)
