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
"""The step math of the built-in recurrent cells, for rnn_rows.py's own time loop.

Each class runs one step of its cell from the precomputed a_t = x_t·W + b (``step``) and
says which rows the recurrent kernel U's per-example gradient sums over
(``recurrent_rows``): ∂ℓ/∂U = Σ_rows inputᵀ·grad.

    SimpleRNN, LSTM:       rows h_{t-1} with δa_t
    GRU, reset_after=True: rows h_{t-1} with [δa_z, δa_r, r_t ⊙ δa_h]
    GRU, reset_after=False: rows h_{t-1} with [δa_z, δa_r, 0] and r_t ⊙ h_{t-1} with [0, 0, δa_h]
"""

import dataclasses

from tf_tempered._compat import keras, tf

__all__ = ["cell_math", "GRU_MATH_TYPE", "GRU_RESET_BEFORE_MATH_TYPE", "LSTM_MATH_TYPE"]


@dataclasses.dataclass(frozen=True)
class _SimpleMath:
    """h_t = act(a_t + h_{t-1}·U); the output is h_t."""
    num_states = 1
    gates = 1
    split_recurrent_bias = False
    has_extras = False
    # Both kernels see δa_t: one row layer of [W; U] (rnn_norms.py).
    stacks_kernels = True
    shares_gate_blocks = False

    def step(self, cell, a_t, states, u):
        h = a_t + tf.matmul(states[0], u)
        h = cell.activation(h) if cell.activation is not None else h
        return h, [h], ()

    def recurrent_rows(self, h_prev, grad_a, extras):
        return h_prev, grad_a


@dataclasses.dataclass(frozen=True)
class _LSTMMath:
    """z = a_t + h_{t-1}·U; i, f, g, o gates; c_t = f·c + i·act(g); h_t = o·act(c_t)."""
    num_states = 2
    gates = 4
    split_recurrent_bias = False
    has_extras = False
    stacks_kernels = True  # as _SimpleMath
    shares_gate_blocks = False

    def step(self, cell, a_t, states, u):
        h_tm1, c_tm1 = states
        z0, z1, z2, z3 = tf.split(a_t + tf.matmul(h_tm1, u), 4, axis=-1)
        act, rec = cell.activation, cell.recurrent_activation
        c = rec(z1) * c_tm1 + rec(z0) * act(z2)
        h = rec(z3) * act(c)
        return h, [h, c], ()

    def recurrent_rows(self, h_prev, grad_a, extras):
        return h_prev, grad_a


@dataclasses.dataclass(frozen=True)
class _GRUMath:
    """reset_after=True: r = h_{t-1}·U + b_rec; z, r gates; h_t = z·h + (1-z)·act(a_h + r·r_h)."""
    num_states = 1
    gates = 3
    split_recurrent_bias = True
    has_extras = True  # the reset gates r_t (recurrent_rows)
    # δa and δr share their z and r blocks: one ghost norm of both kernels (rnn_norms.py).
    shares_gate_blocks = True
    stacks_kernels = False

    def step(self, cell, a_t, states, u, recurrent_bias=None):
        h_tm1 = states[0]
        inner = tf.matmul(h_tm1, u)
        if recurrent_bias is not None:
            inner += recurrent_bias
        x_z, x_r, x_h = tf.split(a_t, 3, axis=-1)
        r_z, r_r, r_h = tf.split(inner, 3, axis=-1)
        rec = cell.recurrent_activation
        z = rec(x_z + r_z)
        r = rec(x_r + r_r)
        hh = cell.activation(x_h + r * r_h)
        h = z * h_tm1 + (1 - z) * hh
        return h, [h], (r,)

    def recurrent_rows(self, h_prev, grad_a, extras):
        (reset,) = extras
        g_z, g_r, g_h = tf.split(grad_a, 3, axis=-1)
        return h_prev, tf.concat([g_z, g_r, reset * g_h], -1)


@dataclasses.dataclass(frozen=True)
class _GRUResetBeforeMath:
    """reset_after=False: z, r from h_{t-1}·U_zr; h_t = z·h + (1-z)·act(a_h + (r·h_{t-1})·U_h).

    U's candidate block sees r_t ⊙ h_{t-1}, its other blocks h_{t-1}: ∂ℓ/∂U is the sum over
    2T rows, h_{t-1} with [δa_z, δa_r, 0] and r_t ⊙ h_{t-1} with [0, 0, δa_h]."""
    num_states = 1
    gates = 3
    split_recurrent_bias = False
    has_extras = True  # the reset gates r_t (recurrent_rows)
    # U's rows are 2T (h_{t-1} and r_t ⊙ h_{t-1}): neither shared form applies.
    stacks_kernels = False
    shares_gate_blocks = False

    def step(self, cell, a_t, states, u):
        h_tm1 = states[0]
        units = h_tm1.shape[-1]
        x_z, x_r, x_h = tf.split(a_t, 3, axis=-1)
        r_z, r_r = tf.split(tf.matmul(h_tm1, u[:, :2 * units]), 2, axis=-1)
        rec = cell.recurrent_activation
        z = rec(x_z + r_z)
        r = rec(x_r + r_r)
        hh = cell.activation(x_h + tf.matmul(r * h_tm1, u[:, 2 * units:]))
        h = z * h_tm1 + (1 - z) * hh
        return h, [h], (r,)

    def recurrent_rows(self, h_prev, grad_a, extras):
        (reset,) = extras
        g_z, g_r, g_h = tf.split(grad_a, 3, axis=-1)
        zeros = tf.zeros_like(g_h)
        return (tf.concat([h_prev, reset * h_prev], 1),
                tf.concat([tf.concat([g_z, g_r, zeros], -1),
                           tf.concat([zeros, zeros, g_h], -1)], 1))


# The step maths rnn_rows.py's native loops take.
LSTM_MATH_TYPE = _LSTMMath
GRU_MATH_TYPE = _GRUMath
GRU_RESET_BEFORE_MATH_TYPE = _GRUResetBeforeMath


def _cells():
    layers = keras.layers
    return {layers.SimpleRNN: (layers.SimpleRNNCell, _SimpleMath()),
            layers.LSTM: (layers.LSTMCell, _LSTMMath()),
            layers.GRU: (layers.GRUCell, _GRUMath())}


def cell_math(layer):
    """(the cell class the layer's call must run, its step math) for a built-in SimpleRNN,
    LSTM or GRU layer, or a plain ``RNN`` holding one of their cells; else None."""
    entries = _cells()
    entry = next((v for k, v in entries.items() if type(layer).call is k.call
                  and isinstance(layer, k)), None)
    if entry is None and type(layer).call is keras.layers.RNN.call:
        # RNN(LSTMCell(...)): the layer's loop runs the cell's own step, the same math.
        entry = next((v for v in entries.values() if isinstance(layer.cell, v[0])), None)
    if entry is None:
        return None
    cell_class, math = entry
    if isinstance(math, _GRUMath) and not getattr(layer.cell, "reset_after", True):
        math = _GRUResetBeforeMath()
    return cell_class, math
