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
"""How large the chunks of ``physical_batch_size="auto"`` are (chunks.py runs them).

What the book-keeping sum keeps of a row until the last norm is estimated from the model's
static shapes (each trainable layer's input and output, a recurrent layer's time-step
rows); a batch whose kept tensors exceed AUTO_CHUNK_BYTES, or whose native-loop recurrent
rows exceed AUTO_RECURRENT_CHUNK_BYTES, runs in equal chunks of at least AUTO_MIN_CHUNK
examples that fit (docs/engine.md, "Less memory at the same speed").

>>> auto_chunk_examples(256, 64), auto_chunk_examples(380, 64), auto_chunk_examples(257, 64)
(64, 76, None)
"""

import math

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import rnn_native_loops

__all__ = ["auto_chunk_examples", "auto_physical_batch_size", "dynamic_chunk_rows",
           "kept_bytes_per_row",
           "time_step_bytes_per_row", "AUTO_CHUNK_BYTES", "AUTO_RECURRENT_CHUNK_BYTES",
           "AUTO_MIN_CHUNK"]

# physical_batch_size="auto" (the default) splits a batch whose kept tensors
# (kept_bytes_per_row · rows) exceed this into chunks that fit in it. Measured on the
# benchmark models (docs/engine.md, "Less memory at the same speed"): CIFAR-10 CNN at
# batch 256 (193 MiB: 4 chunks) peak 1.40x -> 0.53x non-private, time 1.17x -> 1.16x;
# MNIST CNN at 4096 (125 MiB: 2 chunks) 1.05x -> 0.61x, time within 3%; below it (MNIST
# at 256: 8 MiB) chunks would cost time (1.19x -> 1.27x in 2 chunks).
AUTO_CHUNK_BYTES = 64 * 2**20
# A recurrent layer whose time loop is the native op (an LSTM, a GRU)
# keeps T rows an example for its norms, and its loop costs no more time in chunks:
# Embedding + LSTM(64) / GRU(64) over 64 steps, batch 256, chunks of 64 against whole
# (benchmarks/results/chunks_rnn.md, Keras 3 / Keras 2): GRU peak 1.87x / 1.64x -> 0.80x /
# 0.71x non-private, time 0.73x / 1.00x -> 0.70x / 0.96x; LSTM 1.31x / 1.19x -> 0.69x /
# 0.59x, time 0.92x / 0.96x -> 0.92x / 0.95x. TF's while loop (XLA, TF_TEMPERED_NATIVE=0, a
# mask) costs time in chunks (measured on the reset-before GRU before its loop was native:
# 1.26x -> 1.51x): those rows do not count here.
AUTO_RECURRENT_CHUNK_BYTES = 8 * 2**20
# Smaller chunks cost time per example (MNIST CNN at 4096 in chunks of 128: 1.46x
# non-private against 1.18x whole).
AUTO_MIN_CHUNK = 64


def auto_chunk_examples(examples, physical):
    """Examples per chunk of "auto": equal chunks of at least AUTO_MIN_CHUNK examples, the
    largest of them within ``physical``, else the smallest (a little over the budget
    rather than more, smaller chunks: a padded Poisson batch of 380 rows in chunks of 38
    took 1.18x the non-private LSTM step, in chunks of 95 0.90x, whole 0.98x); None if
    no such split (whole).
    """
    sizes = [examples // count for count in range(2, examples // AUTO_MIN_CHUNK + 1)
             if examples % count == 0]
    within = [size for size in sizes if size <= physical]
    return within[0] if within else (sizes[-1] if sizes else None)


def dynamic_chunk_rows(rows, limit, multiplicity):
    """Rows per chunk of a batch of ``rows`` known only when the step runs (a tensor): the
    fewest chunks of at most ``limit`` examples, but of at least AUTO_MIN_CHUNK, as equal
    as whole examples allow: n = max(1, min(⌈E/limit⌉, ⌊E/AUTO_MIN_CHUNK⌋)) chunks of
    ⌈E/n⌉ examples, the last one shorter, for E = rows/multiplicity examples.

    >>> [int(dynamic_chunk_rows(tf.constant(r), 84, 1)) for r in (256, 250, 100, 0)]
    [64, 84, 100, 1]
    """
    examples = rows // multiplicity
    count = tf.maximum(1, tf.minimum(-(-examples // limit), examples // AUTO_MIN_CHUNK))
    # (At least one example: an empty Poisson batch then runs no chunk, as for an int.)
    return tf.maximum(-(-examples // count), 1) * multiplicity


def kept_bytes_per_row(model):
    """Σ over the model's layers with trainable weights of their input and output sizes, in
    float32 bytes per row: what the book-keeping sum keeps of a row (each layer's input and
    output gradient) until the last norm, and for a recurrent layer its time steps' rows
    (:func:`_time_step_rows`). None where Keras knows no static shapes (a subclassed
    model, a sequence of unknown length)."""
    total = 0
    for layer in model.layers:
        if not layer.built:  # (tf-keras' unbuilt Sequential raises on its weights)
            return None
        if not layer.trainable_weights:
            continue
        try:
            tensors = tf.nest.flatten([layer.input, layer.output])
        except (AttributeError, ValueError, RuntimeError):  # never called on Keras tensors
            return None
        for tensor in tensors:
            dims = tuple(tensor.shape)[1:]
            if None in dims:
                return None
            total += 4 * math.prod(dims)
        total += _time_step_bytes(layer)
    return total


def _time_step_bytes(layer):
    return 4 * _time_step_rows(layer, tuple(tf.nest.flatten(layer.input)[0].shape))


def _time_step_rows(layer, input_shape):
    """Floats an RNN layer of a Dense-like cell keeps per example for its norms
    (layer_grads/rnn_rows.py): at each of its T steps the input x_t (D), the gate
    gradients δa_t and δr_t (G each, the kernel's width) and the state h_{t-1} (U):
    T·(D + 2G + U); a GRU with reset_after=False, whose recurrent kernel has 2T rows
    (h_{t-1} and r_t ⊙ h_{t-1}, rnn_cell_math.py), T·(D + 3G + 2U); 0 for other layers."""
    cell = getattr(layer, "cell", None)
    kernel = getattr(cell, "kernel", None)
    if not keras_bridge.is_recurrent_unit(layer) or kernel is None or len(input_shape) != 3:
        return 0
    inputs, gates = keras_bridge.shape_of(kernel)[-2:]
    units = keras_bridge.shape_of(cell.recurrent_kernel)[0]
    if getattr(cell, "reset_after", True) is False:
        return input_shape[1] * (inputs + 3 * gates + 2 * units)
    return input_shape[1] * (inputs + 2 * gates + units)


def time_step_bytes_per_row(model):
    """Bytes a row keeps of its recurrent layers' time steps: Σ 4·T·(D + 2G + U)."""
    return sum(_time_step_bytes(layer) for layer in _recurrent_units(model))


def auto_physical_batch_size(model, examples, multiplicity, options=None):
    """The chunk size (examples) of ``physical_batch_size="auto"``: chunks whose kept
    tensors fit in AUTO_CHUNK_BYTES, and whose recurrent rows fit in
    AUTO_RECURRENT_CHUNK_BYTES if every time loop is native with these EngineOptions, of
    at least AUTO_MIN_CHUNK examples; None: whole."""
    per_row = kept_bytes_per_row(model)
    if per_row is None:
        return None
    rows = examples * multiplicity
    budgets = [AUTO_CHUNK_BYTES // per_row] if per_row * rows > AUTO_CHUNK_BYTES else []
    recurrent = time_step_bytes_per_row(model)
    # (runs_natively last: it may build the native library.)
    if recurrent * rows > AUTO_RECURRENT_CHUNK_BYTES and all(
            not keras_bridge.receives_mask(layer) and rnn_native_loops.runs_natively(layer, options)
            for layer in _recurrent_units(model)):
        budgets.append(AUTO_RECURRENT_CHUNK_BYTES // recurrent)
    if not budgets:
        return None
    return max(AUTO_MIN_CHUNK, min(budgets) // multiplicity)


def _recurrent_units(model):
    return [layer for layer in model.layers
            if layer.trainable_weights and keras_bridge.is_recurrent_unit(layer)]
