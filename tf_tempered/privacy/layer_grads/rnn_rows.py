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
"""SimpleRNN, LSTM and GRU as row layers over their time steps.

Each step of these layers computes its gate pre-activations as

    z_t = x_t·W + h_{t-1}·U + b            (SimpleRNN, LSTM)
    a_t = x_t·W + b_in,  r_t = h_{t-1}·U + b_rec   (GRU, reset_after=True)
    a_t = x_t·W + b,  h_{t-1}·U_zr and (r_t ⊙ h_{t-1})·U_h   (GRU, reset_after=False)

so an example's gradient of the cell's weights is a sum of row outer products
over its time steps, as for a Dense layer applied to every step:

    ∂ℓ/∂W = Σ_t x_t δa_tᵀ,   ∂ℓ/∂U = Σ_t h_{t-1} δr_tᵀ,   ∂ℓ/∂b = Σ_t δa_t (and δr_t)

with δa_t = ∂ℓ/∂a_t. For SimpleRNN and LSTM δr_t = δa_t = δz_t; for the GRU
δr_t = [δa_z, δa_r, r_t ⊙ δa_h] (its candidate gate multiplies the recurrent
part by the reset gate r_t; with reset_after=False the candidate block of U sees
r_t ⊙ h_{t-1} instead, as T more rows). The handler runs the layer's own forward pass
itself, with A = X·W + b computed for all steps at once before the time loop:
the one backward pass then gives δA as the gradient of a recorded tensor, and
the loop gives the states h_{t-1} (and r_t) entering each step. On CPU the loop of an
LSTM or a GRU (either reset_after) with Keras' sigmoid gates and tanh is a native op
(native.lstm_sequence, native.gru_sequence: forward and backward, each example's recurrence
in one task), else TF's while loop (time_loop). Norms and the
clipped sum are those of rows.py (ghost norm or materialized gradients, the
book-keeping sum), exact, with no per-example VJP: the generic recurrent path
(rnn.py) vectorizes the whole time loop over the examples, about 5x the
non-private step's time and 30x its memory on a text LSTM.

Covered: the built-in cells with their own `call` (in their layers or in a plain
``RNN``), any activation, masks
(Embedding(mask_zero=True)), go_backwards, initial_state, return_state,
return_sequences, unroll, static or unknown sequence length; a layer called
several times (its calls' rows are concatenated per example). Everything else
(dropout, stateful, time_major, constants, a dtype
policy that casts the weights) takes the recurrent unit's path (rnn.py), which
refuses what it cannot do exactly.

>>> from tf_tempered._compat import keras
>>> from tf_tempered.privacy import layer_grads
>>> layer = keras.layers.LSTM(4)
>>> layer.build((None, 5, 3))
>>> layer_grads.lookup(layer)[0].name
'rnn_rows'
"""

import dataclasses
import inspect
import types
from typing import Any

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import rnn_native_loops, rnn_norms
from tf_tempered.privacy.layer_grads.contract import Handler
from tf_tempered.privacy.layer_grads.registry import overridden_hook, register
from tf_tempered.privacy.layer_grads.rnn_cell_math import cell_math

__all__ = ["RNNRowsHandler", "RNNRowsHyperparameters", "bind_call", "merge_calls_on_time_axis",
           "time_loop"]


@dataclasses.dataclass(frozen=True)
class RNNRowsHyperparameters:
    """Plain hyperparameters of a SimpleRNN/LSTM/GRU layer (and its cell's math)."""
    name: str
    math: Any
    units: int
    use_bias: bool
    kernel_shape: tuple
    recurrent_kernel_shape: tuple
    return_sequences: bool
    return_state: bool
    go_backwards: bool
    zero_output_for_mask: bool


# Also for RNN: RNN(LSTMCell(...)) and the like (registered before rnn.py, which takes the
# RNN layers this handler declines).
@register(keras.layers.SimpleRNN, keras.layers.LSTM, keras.layers.GRU, keras.layers.RNN)
class RNNRowsHandler(Handler):
    """Runs the layer's forward pass itself to record X·W + b; rows over time steps."""

    name = "rnn_rows"
    summary = ("SimpleRNN, LSTM, GRU (reset_after either way) and RNN of one of their cells, "
               "without dropout: the handler runs "
               "the time loop itself with X·W + b computed before it, so one backward pass "
               "gives each step's gate gradients; the kernels' per-microbatch norms and "
               "clipped sums as for a Dense layer over the time steps (inputs, and the states "
               "entering each step); masks, go_backwards, initial and returned states")
    records_own_forward = True

    def hyperparameters(self, layer):
        cell = getattr(layer, "cell", None)
        entry = cell_math(layer) if cell is not None else None
        if (entry is None or type(cell).call is not entry[0].call
                or overridden_hook(type(cell), entry[0]) is not None):
            return None  # a custom cell (or gate math of its own): the recurrent unit's VJP
        if (getattr(cell, "dropout", 0) or getattr(cell, "recurrent_dropout", 0)
                or getattr(layer, "stateful", False) or getattr(layer, "time_major", False)
                or tf.as_dtype(cell.kernel.dtype).name != _compute_dtype(layer)):
            return None  # rnn.py handles (or refuses with the fix) these
        math = entry[1]
        return RNNRowsHyperparameters(
            layer.name, math, int(cell.units), bool(cell.use_bias),
            keras_bridge.shape_of(cell.kernel), keras_bridge.shape_of(cell.recurrent_kernel),
            bool(layer.return_sequences), bool(layer.return_state), bool(layer.go_backwards),
            bool(getattr(layer, "zero_output_for_mask", False)))

    def variables(self, layer, hparams):
        cell = layer.cell
        return [cell.kernel, cell.recurrent_kernel] + ([cell.bias] if hparams.use_bias else [])

    def recorded_call(self, layer, hparams, call_fn, inputs, args, kwargs, wrap, options=None):
        """The layer's output(s) by its own math, or None to leave the call to rnn.py.

        Returns (outputs, recorded inputs (X, H_prev[, reset gates]), recorded output A);
        `wrap` is applied to A before the time loop uses it (second_pass's norm hook). An
        LSTM's or GRU's loop is a native op where ``options`` (EngineOptions; None: the
        defaults) allow it (rnn_native_loops.py), else TF's while loop.
        """
        call = bind_call(call_fn, inputs, args, kwargs)
        if call is None:
            return None
        x, initial_state, mask = call
        cell, math = layer.cell, hparams.math
        dtype = x.dtype
        if hparams.go_backwards:
            x = tf.reverse(x, [1])
            mask = None if mask is None else tf.reverse(mask, [1])
        kernel, u = tf.cast(cell.kernel, dtype), tf.cast(cell.recurrent_kernel, dtype)
        bias = tf.cast(cell.bias, dtype) if hparams.use_bias else None
        input_bias, recurrent_bias = bias, None
        if bias is not None and math.split_recurrent_bias:
            input_bias, recurrent_bias = bias[0], bias[1]
        stacked = math.stacks_kernels
        a = _matmul_rows(x, kernel) if stacked else tf.matmul(x, kernel)  # [B, T, gates·units]
        if input_bias is not None:
            a += input_bias
        a = wrap(a)
        batch = tf.shape(x)[0]
        states = (list(initial_state) if initial_state is not None else
                  [tf.zeros([batch, hparams.units], dtype)] * math.num_states)
        step_kwargs = {"recurrent_bias": recurrent_bias} if math.split_recurrent_bias else {}
        native_loop = rnn_native_loops.native_loop(cell, math, a, states, mask, options)
        if native_loop is not None:
            sequence, h_prev, rest, final_states, last_output = native_loop(
                a, u, states, recurrent_bias)
        else:
            sequence, h_prev, rest, final_states, last_output = time_loop(
                lambda a_t, step_states: math.step(cell, a_t, step_states, u, **step_kwargs),
                a, states, mask, zero_output_for_mask=hparams.zero_output_for_mask,
                num_extras=int(math.has_extras))
        recorded = (x, h_prev) + tuple(rest)
        output = sequence if hparams.return_sequences else last_output
        if hparams.return_state:
            result = keras_bridge.rnn_call_result(output, list(final_states))
        else:
            result = output
        return result, recorded, a

    def layer_result(self, call, hparams, layout):
        x, h_prev, *extras = call.inputs
        return rnn_norms.recurrent_layer_result(x, h_prev, extras, call.grad_output, hparams,
                                                layout)

    def merge_calls(self, calls):
        return merge_calls_on_time_axis(self, calls)


def merge_calls_on_time_axis(handler, calls):
    """A layer called several times: its calls' steps side by side per example (time axis),
    as one call-like record of ``handler``."""
    return types.SimpleNamespace(
        layer=calls[0].layer, handler=handler, hparams=calls[0].hparams,
        inputs=tuple(tf.concat(parts, 1) for parts in zip(*(c.inputs for c in calls))),
        grad_output=tf.concat([c.grad_output for c in calls], 1))


def _matmul_rows(x, kernel):
    """x·kernel of a [B, T, d_in] x as one [B·T, d_in] matrix product (and so its gradient).

    TF's CPU kernels run a rank-3 by rank-2 tf.matmul (a broadcast BatchMatMul) 2.5x slower
    than the same product as one matrix (256×64×64 by 64×256: 21 ms against 8.5 ms on 2
    vCPUs). Used for SimpleRNN/LSTM only: there it paid for their stacked ghost norm at the
    same peak memory, while a GRU's step took 27 % more peak memory with it, for 6 % of
    its time (benchmarks/results/rnn_stacked_ab_keras3.md).
    """
    rows = tf.matmul(tf.reshape(x, [-1, x.shape[-1]]), kernel)
    shape = tf.concat([tf.shape(x)[:-1], [kernel.shape[-1]]], 0)
    return tf.ensure_shape(tf.reshape(rows, shape), x.shape[:-1].concatenate(kernel.shape[-1:]))


def _compute_dtype(layer):
    dtype = getattr(layer, "compute_dtype", None) or getattr(layer, "dtype", "float32")
    return tf.as_dtype(dtype).name


def time_loop(layout, a, states, mask=None, *, zero_output_for_mask=False, num_extras=0):
    """Runs ``step(a_t, states) → (output, new states, extras)`` over the steps of a [B, T, ...].

    Returns (the outputs [B, T, ...], the first state entering each step h_{t-1} [B, T, ...],
    the extras of each step [[B, T, ...]], the final states, the last output). A masked step
    keeps the states and repeats the previous output (zeros if zero_output_for_mask): Keras'
    semantics. The states' static shapes must not change from step to step.
    """
    # The time loop over [T, B, ...] tensors; swapping the first two axes goes both ways.
    swap = lambda t: tf.transpose(t, [1, 0] + list(range(2, t.shape.rank)))
    dtype = states[0].dtype
    num_steps = a.shape[1] if a.shape[1] is not None else tf.shape(a)[1]
    # Steps are read from TensorArrays (indexing a tensor in the loop would make its
    # gradient a dense [T, ...] tensor per step).
    a_steps = tf.TensorArray(a.dtype, size=num_steps).unstack(swap(a))
    keep_steps = None if mask is None else tf.TensorArray(tf.bool, size=num_steps).unstack(
        swap(tf.cast(mask, tf.bool)))
    # Written per step: the state h_t (the next step's h_{t-1}), the output where a
    # mask can make it differ from h_t, and the extras (the GRU's reset gate).
    arrays = lambda: tf.TensorArray(dtype, size=num_steps, element_shape=states[0].shape)
    written = [arrays() for _ in range(1 + (mask is not None) + num_extras)]

    def body(t, step_states, prev_output, written):
        output, new_states, extras = layout(a_steps.read(t), step_states)
        if keep_steps is not None:  # a masked step keeps the states (Keras' semantics)
            keep = tf.reshape(keep_steps.read(t), [-1] + [1] * (output.shape.rank - 1))
            new_states = [tf.where(keep, n, o) for n, o in zip(new_states, step_states)]
            output = tf.where(keep, output,
                              tf.zeros_like(output) if zero_output_for_mask else prev_output)
            values = [new_states[0], output, *extras]
        else:
            values = [new_states[0], *extras]
        return (t + 1, new_states, output,
                [w.write(t, v) for w, v in zip(written, values)])

    # maximum_iterations: XLA differentiates a loop that writes TensorArrays only
    # with a bound on its length.
    _, final_states, last_output, written = tf.while_loop(
        lambda t, *_: t < num_steps, body,
        (tf.constant(0), states, tf.zeros_like(states[0]), written),
        maximum_iterations=num_steps)
    h_seq, *rest = [swap(w.stack()) for w in written]  # [B, T, ...]
    sequence = rest.pop(0) if mask is not None else h_seq
    h_prev = tf.concat([states[0][:, None], h_seq[:, :-1]], 1)
    return sequence, h_prev, rest, final_states, last_output


def bind_call(call_fn, inputs, args, kwargs, rank=3):
    """(x, initial states or None, mask or None) of an RNN call on a [B, T, ...] input of
    `rank` dimensions, or None for other arguments."""
    try:
        bound = inspect.signature(call_fn).bind(inputs, *args, **kwargs)
    except TypeError:
        return None
    arguments = dict(bound.arguments)
    arguments.pop("training", None)
    x = arguments.pop(next(iter(bound.signature.parameters)))
    initial_state = arguments.pop("initial_state", None)
    mask = arguments.pop("mask", None)
    if any(v is not None for v in arguments.values()):
        return None  # constants or an argument of a newer Keras: leave it to rnn.py
    unpacked = keras_bridge.rnn_call_inputs(x, initial_state, mask)
    if unpacked is None:
        return None
    x, initial_state, mask = unpacked
    if initial_state is not None and not isinstance(initial_state, (list, tuple)):
        initial_state = [initial_state]
    if not isinstance(x, tf.Tensor) or x.shape.rank != rank:
        return None
    if initial_state is not None:
        initial_state = [tf.cast(s, x.dtype) for s in initial_state]
    return x, initial_state, mask
