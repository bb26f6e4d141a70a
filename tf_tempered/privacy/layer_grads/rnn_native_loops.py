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
"""The time loops of rnn_rows.py's LSTM and GRU as native ops (privacy/native, CPU).

:func:`native_loop` picks the op's loop for a call, or None for TF's while loop
(rnn_rows.time_loop); each returns what time_loop returns: (the outputs [B, T, H], the
states h_{t-1} entering each step, the extras (the GRU's reset gates: its recurrent
kernel's rows), the final states, the last output).
"""

import functools

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import native
from tf_tempered.privacy.layer_grads import rnn_cell_math

__all__ = ["native_loop", "runs_natively"]


def native_loop(cell, math, a, states, mask, options):
    """The native op's time loop for this call (privacy/native, CPU), or None for TF's.

    An LSTM or a GRU (either reset_after) with Keras' sigmoid gates and tanh, float32, no
    mask, where the step's options allow native ops (not under XLA, TF_TEMPERED_NATIVE not
    off) and native.usable says they run (no GPU; a small layer builds no library).
    """
    loop = _LOOPS.get(type(math))
    if loop is None or mask is not None:
        return None
    if (cell.activation is not keras.activations.tanh
            or cell.recurrent_activation is not keras.activations.sigmoid):
        return None
    if a.dtype != tf.float32 or any(s.dtype != tf.float32 for s in states):
        return None
    if options is not None and not options.native:
        return None
    return loop if native.usable(a.shape.num_elements()) else None


def runs_natively(layer, options):
    """Whether ``layer``'s time loop would be the native op in a step with ``options``,
    from what is known before a call: native_loop's conditions but the mask, which the
    call brings (keras_bridge.receives_mask reads it from a model's recorded inputs).

    >>> runs_natively(keras.layers.GRU(4, activation="relu"), None)
    False
    """
    entry = rnn_cell_math.cell_math(layer)
    if entry is None or type(entry[1]) not in _LOOPS:
        return False
    cell = layer.cell
    if (cell.activation is not keras.activations.tanh
            or cell.recurrent_activation is not keras.activations.sigmoid):
        return False
    if getattr(layer, "compute_dtype", "float32") != "float32":
        return False
    if options is not None and not options.native:
        return False
    return native.usable()


def _native_lstm_loop(a, u, states, recurrent_bias):
    """time_loop's results for an LSTM from the native op (no mask, no extras)."""
    del recurrent_bias  # the LSTM's one bias is in a
    h0, c0 = states
    h_seq, c_seq = native.lstm_sequence(a, u, h0, c0)
    h_prev = tf.concat([h0[:, None], h_seq[:, :-1]], 1)
    final_states = [h_seq[:, -1], c_seq[:, -1]]
    return h_seq, h_prev, [], final_states, final_states[0]


def _native_gru_loop(a, u, states, recurrent_bias, *, reset_after=True):
    """time_loop's results for a GRU from the native op: the reset gates are its extras (the
    recurrent kernel's rows). reset_after=False has its one bias in a: no recurrent bias."""
    (h0,) = states
    if recurrent_bias is None:
        recurrent_bias = tf.zeros([u.shape[-1]], u.dtype)
    h_seq, reset = native.gru_sequence(a, u, recurrent_bias, h0, reset_after=reset_after)
    h_prev = tf.concat([h0[:, None], h_seq[:, :-1]], 1)
    return h_seq, h_prev, [reset], [h_seq[:, -1]], h_seq[:, -1]


# The step maths whose time loop the native ops run, and how.
_LOOPS = {rnn_cell_math.LSTM_MATH_TYPE: _native_lstm_loop,
          rnn_cell_math.GRU_MATH_TYPE: _native_gru_loop,
          rnn_cell_math.GRU_RESET_BEFORE_MATH_TYPE: functools.partial(_native_gru_loop,
                                                                      reset_after=False)}
