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
"""Keras internals about recurrent layers: which layers the engine treats as one unit, their
masks, and the call arguments and results that differ between Keras 2 and 3."""

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["is_recurrent_unit", "receives_mask", "rnn_call_inputs",
           "rnn_call_result", "vectorized_map_takes_recurrent_layers"]

IS_KERAS3 = KERAS_MAJOR == 3


def is_recurrent_unit(layer):
    """Whether the DP engine treats `layer` as one unit with its sub-layers' weights:
    an RNN layer (SimpleRNN, LSTM, GRU, ConvLSTM*, RNN(cell)).

    Its cell is called inside the layer's time loop (Keras 3) or not at all (tf-keras'
    fused LSTM/GRU kernels), so what the cell sees cannot be recorded: the layer's
    own call is recorded instead (layer_grads/rnn_rows.py, rnn.py). A Bidirectional
    is not a unit: it calls its two RNN layers in its own call, and each is recorded.
    """
    return isinstance(layer, keras.layers.RNN)


def receives_mask(layer):
    """Whether a layer of a Functional or Sequential model is called with a Keras mask
    (an Embedding(mask_zero=True) or Masking before it), from the inputs Keras recorded;
    False where it recorded none (a subclassed model).

    Keras 3 records the mask among the layer's inputs, tf-keras on its input tensor;
    both keep it as the tensors' private ``_keras_mask``.
    """
    try:
        inputs = tf.nest.flatten(layer.input)
    except (AttributeError, ValueError, RuntimeError):  # never called on Keras tensors
        return False
    return any(getattr(tensor, "_keras_mask", None) is not None for tensor in inputs)


def rnn_call_result(output, final_states):
    """What an RNN layer with return_state=True returns: Keras 3 a tuple (output, *states),
    tf-keras a list [output, *states]."""
    return (output, *final_states) if IS_KERAS3 else [output, *final_states]


def rnn_call_inputs(x, initial_state, mask):
    """(x, initial states or None, mask or None) of an RNN layer's call arguments, or None.

    tf-keras' functional API passes the initial states inside the first argument,
    ``[x, *initial states]`` (with a list of masks); None if states come both ways.
    """
    if isinstance(x, (list, tuple)):
        if initial_state is not None or len(x) < 1:
            return None
        x, initial_state = x[0], (list(x[1:]) or None)
    if isinstance(mask, (list, tuple)):
        mask = mask[0]
    return x, initial_state, mask


def vectorized_map_takes_recurrent_layers():
    """Whether TF's vectorized_map can run an RNN layer's call per example: not on tf-keras,
    whose fused LSTM/GRU functions it cannot convert (a TypeError on a variant tensor)."""
    return IS_KERAS3
