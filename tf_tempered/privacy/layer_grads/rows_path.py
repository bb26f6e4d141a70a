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
"""Which path a row layer takes (rows.py): materialized per-microbatch gradients or the ghost norm.

A handler describes its recorded call as rows with a `RowSource`; `choose_materialize`
takes the path with fewer multiply-adds per microbatch where `fits` allows its memory
(EngineOptions.materialize_max_bytes, and no more than the ghost norm keeps times the
ghost norm's extra cost, at most MAX_MEMORY_SLACK), and the
handler records the choice as a `RowsPath`. rows.py computes the norms on that path and
re-exports these names.
"""

import dataclasses
from typing import Any, Callable

import numpy as np

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads.contract import LayerPath

__all__ = ["ALWAYS_MATERIALIZE_BYTES", "MAX_MEMORY_SLACK", "RowSource", "RowsPath",
           "choose_materialize", "fits", "static_rows"]


@dataclasses.dataclass(frozen=True)
class RowsPath(LayerPath):
    """A row layer's path: materialize True (per-microbatch gradients kept: a
    matrix-vector clipped sum), False (ghost norm, book-keeping sum), or a
    boolean tensor decided per step when the microbatch count is not static."""
    materialize: Any


@dataclasses.dataclass(frozen=True, eq=False)
class RowSource:
    """A recorded call as rows.

    inputs: the recorded input [B, ...]; grad_output: G [B, ..., d_out];
    to_rows: recorded inputs (a chunk of examples) → a rows [b, ..., d_in]
    (identity for Dense; patches for Conv2D); d_in: the width of a row a_r;
    chunked: whether to_rows makes a larger tensor (patches), which is then
    made and used in chunks of patch_chunk_bytes.
    """
    inputs: Any
    grad_output: Any
    d_in: int
    options: Any
    to_rows: Callable[[Any], Any] = lambda x: x
    chunked: bool = False


def static_rows(t, examples_per_microbatch):
    """Rows per microbatch of a recorded [B, ..., d] tensor (per example when E is None), or
    None when an axis between is not known while tracing (a sequence's length: padded_batch
    of variable-length sequences crashed here with TypeError; probe P3, F4)."""
    middle = t.shape[1:-1] if len(t.shape) > 2 else []
    if any(size is None for size in middle):
        return None
    return int(np.prod(middle, dtype=np.int64)) * (examples_per_microbatch or 1)


# Per-microbatch gradients of one layer below this many bytes are kept whatever the
# ghost norm would keep instead: next to the activations that memory is negligible, and
# materializing is usually the faster path (the MNIST CNN's conv2 with 4 examples per
# microbatch: 2 MiB).
ALWAYS_MATERIALIZE_BYTES = 8 * 2**20

# Where the ghost norm costs k times the multiply-adds of materializing, the kept gradients
# may take up to min(k, MAX_MEMORY_SLACK) times what the ghost norm keeps (choose_materialize).
# The CIFAR-10 CNN's conv4 on the TF-ops path: its ghost norm is 4.4× the multiply-adds
# (256·(576 + 64) against 576·64 per example), its gradients 1.125× the memory: with a
# slack of 1 the TF-ops step took 1.2× its time now (benchmarks/results/tf_ops_memory_slack/).
MAX_MEMORY_SLACK = 2.0


def fits(src, num_microbatches, examples_per_microbatch=None, *, slack=1.0):
    """Whether per-microbatch kernel gradients fit in materialize_max_bytes (a tensor if M is)
    and, above ALWAYS_MATERIALIZE_BYTES, take no more memory than ``slack`` times what the
    ghost norm keeps.

    The book-keeping sum of a ghost-norm layer keeps its input and output gradient,
    E·(|x| + |g|) values per microbatch of E examples, until the clip factors are
    known; materializing keeps d_in·d_out per microbatch. Where that is more, the layer
    takes the (native or ghost) norms and the book-keeping sum instead (the CIFAR-10
    CNN's conv4 at batch 256: docs/engine.md, "How each layer's path is chosen"). With
    E unknown (a fixed microbatch count and a batch size unknown while tracing), only
    the first rule.
    """
    g = src.grad_output
    per_microbatch = src.d_in * g.shape[-1] * g.dtype.size
    total = num_microbatches * per_microbatch
    within_cap = total <= src.options.materialize_max_bytes
    kept = _kept_bytes_per_example(src)
    if examples_per_microbatch is None or kept is None or src.options.forced == "materialize":
        return within_cap
    smaller = per_microbatch <= slack * examples_per_microbatch * kept
    small = total <= ALWAYS_MATERIALIZE_BYTES
    if tf.is_tensor(within_cap):
        return tf.logical_and(within_cap, tf.logical_or(smaller, small))
    return within_cap and (smaller or small)


def _kept_bytes_per_example(src):
    """Bytes per example of the recorded input and output gradient (None if not static)."""
    total = 0
    for t in tf.nest.flatten(src.inputs) + [src.grad_output]:
        if not t.shape[1:].is_fully_defined():
            return None
        total += t.shape[1:].num_elements() * t.dtype.size
    return total


def choose_materialize(src, num_microbatches, examples_per_microbatch):
    """Ghost norm or materialized gradients (TF ops): the materialize flag."""
    d_in, d_out = src.d_in, src.grad_output.shape[-1]
    forced = src.options.forced
    # Per microbatch the ghost norm costs rows²·(d_in + d_out) multiply-adds and
    # materializing rows·d_in·d_out: take the cheaper. Unknown rows (dynamic
    # batch, fixed microbatch count) make the ghost cost unbounded: materialize.
    if forced in ("ghost", "materialize"):
        return forced == "materialize"
    if examples_per_microbatch is None:
        return True  # num_microbatches is then a static count
    g_rows = static_rows(src.grad_output, examples_per_microbatch)
    if g_rows is None:
        return True  # rows unknown: as above
    kept_cost, ghost_cost = d_in * d_out, g_rows * (d_in + d_out)
    if kept_cost > ghost_cost:
        return False
    # The memory the ghost norm would save is paid for in its extra multiply-adds: a
    # slack of their ratio, up to MAX_MEMORY_SLACK. A tensor when the microbatch count
    # is not static: decided per step.
    slack = (MAX_MEMORY_SLACK if ghost_cost >= MAX_MEMORY_SLACK * kept_cost
             else ghost_cost / kept_cost)
    return fits(src, num_microbatches, examples_per_microbatch, slack=slack)
