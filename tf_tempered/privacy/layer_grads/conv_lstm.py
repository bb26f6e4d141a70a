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
"""ConvLSTM1D, ConvLSTM2D and ConvLSTM3D as convolutions called once per time step.

Each step of a ConvLSTM computes its four gates' pre-activations (i, f, c, o, stacked on
the channel axis) with two convolutions, the input's with the layer's strides, dilations
and padding and the state's with "same" padding, stride 1:

    z_t = conv(x_t, W) + conv_same(h_{t-1}, U) + b
    c_t = σ(z_f)·c_{t-1} + σ(z_i)·act(z_c),   h_t = σ(z_o)·act(c_t)

so with δz_t = ∂ℓ/∂z_t an example's gradient is that of two convolution layers each
called T times:

    ∂ℓ/∂W = Σ_t ∇_W conv(x_t, δz_t),   ∂ℓ/∂U = Σ_t ∇_U conv_same(h_{t-1}, δz_t),
    ∂ℓ/∂b = Σ_t Σ_pixels δz_t,

which is what the convolution handlers compute from T rows per example ([B·T, ...],
example-major; ``Handler.sums_rows_per_example``). The handler runs the layer's forward
pass itself (as rnn_rows.py does), with A = conv(X, W) + b computed for all steps at once
before the time loop: the one backward pass then gives δA = δZ as the gradient of a
recorded tensor, and the loop gives the states h_{t-1} entering each step. The input
part (X, δA) and the recurrent part (H_prev, δA) take the Conv2D handler's paths (native
op, depthwise backprop, patches with ghost norms or materialized gradients; a ConvLSTM1D
as the Conv2D of height 1) or the Conv3D handler's (volume patches): exact, with no
per-example VJP of the time loop (rnn.py's).

Covered: channels_last, "same" or "valid" padding, any strides or dilations, any
activations, with or without bias, go_backwards, return_sequences, return_state,
initial_state, static or unknown sequence length; a layer called several times (its
calls' steps are concatenated per example). Declined, to the recurrent unit's path
(rnn.py, which refuses what it cannot do exactly): dropout or recurrent_dropout > 0,
stateful, a call with a mask, channels_first, a dtype policy that casts the weights, a
cell other than Keras' own.

>>> from tf_tempered._compat import keras
>>> from tf_tempered.privacy import layer_grads
>>> layer = keras.layers.ConvLSTM2D(4, 3, strides=2)
>>> layer.build((None, 5, 9, 9, 3))
>>> layer_grads.lookup(layer)[0].name
'conv_lstm'
"""

import dataclasses
import sys
import types
from typing import Any, Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads.contract import Handler, LayerPath, LayerResult
from tf_tempered.privacy.layer_grads.conv import Conv2DHandler, Conv2DHyperparameters
from tf_tempered.privacy.layer_grads.conv3d import Conv3DHandler, Conv3DHyperparameters
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.rnn_rows import bind_call, merge_calls_on_time_axis, time_loop

__all__ = ["ConvLSTMHandler", "ConvLSTMHyperparameters", "ConvLSTMPath"]


@dataclasses.dataclass(frozen=True)
class ConvLSTMHyperparameters:
    """Plain hyperparameters of a ConvLSTM layer; `inputs` and `recurrent`: those of the
    convolution handler (Conv2D's, or Conv3D's for a ConvLSTM3D) for W and for U."""
    name: str
    rank: int
    filters: int
    use_bias: bool
    strides: Tuple[int, ...]
    dilation_rate: Tuple[int, ...]
    padding: str
    kernel_shape: Tuple[int, ...]
    recurrent_kernel_shape: Tuple[int, ...]
    return_sequences: bool
    return_state: bool
    go_backwards: bool
    inputs: Any
    recurrent: Any


@dataclasses.dataclass(frozen=True)
class ConvLSTMPath(LayerPath):
    """The convolution handlers' paths of the input part (x_t, δz_t) and the recurrent part
    (h_{t-1}, δz_t)."""
    inputs: Any
    recurrent: Any


@register(keras.layers.ConvLSTM1D, keras.layers.ConvLSTM2D, keras.layers.ConvLSTM3D)
class ConvLSTMHandler(Handler):
    """Runs the layer's forward pass itself to record conv(X, W) + b; conv rows over time steps."""

    name = "conv_lstm"
    summary = ("channels_last, any strides, dilations and padding, without dropout: the "
               "handler runs the time loop itself with conv(X, W) + b computed before it, so "
               "one backward pass gives each step's gate gradients; the kernels' "
               "per-microbatch norms and clipped sums as for a Conv2D (ConvLSTM1D/2D) or "
               "Conv3D (ConvLSTM3D) layer called once per time step (inputs, and the states "
               "entering each step); go_backwards, initial and returned states")
    records_own_forward = True

    def hyperparameters(self, layer):
        cell = getattr(layer, "cell", None)
        if (type(cell) is not _keras_cell_class()  # pylint: disable=unidiomatic-typecheck
                or str(cell.data_format).lower() != "channels_last"
                or str(cell.padding).lower() not in ("same", "valid")
                or cell.dropout or cell.recurrent_dropout or getattr(layer, "stateful", False)
                or tf.as_dtype(cell.kernel.dtype).name != _compute_dtype(layer)):
            return None  # rnn.py handles (or refuses with the fix) these
        rank = len(cell.kernel_size)
        ints = lambda v: tuple(int(i) for i in v)
        strides, dilation = ints(cell.strides), ints(cell.dilation_rate)
        padding = str(cell.padding).lower()
        kernel_shape = keras_bridge.shape_of(cell.kernel)
        recurrent_kernel_shape = keras_bridge.shape_of(cell.recurrent_kernel)
        use_bias = bool(cell.use_bias)
        return ConvLSTMHyperparameters(
            layer.name, rank, int(cell.filters), use_bias, strides, dilation, padding,
            kernel_shape, recurrent_kernel_shape, bool(layer.return_sequences),
            bool(layer.return_state), bool(layer.go_backwards),
            _conv(layer.name, kernel_shape, strides, dilation, padding, use_bias),
            _conv(layer.name, recurrent_kernel_shape, (1,) * rank, (1,) * rank, "same", False))

    def variables(self, layer, hparams):
        cell = layer.cell
        return [cell.kernel, cell.recurrent_kernel] + ([cell.bias] if hparams.use_bias else [])

    def recorded_call(self, layer, hparams, call_fn, inputs, args, kwargs, wrap, options=None):
        """The layer's output(s) by its own math, or None to leave the call to rnn.py.

        Returns (outputs, recorded inputs (X, H_prev), recorded output A = conv(X, W) + b);
        `wrap` is applied to A before the time loop uses it (second_pass's norm hook).
        """
        call = bind_call(call_fn, inputs, args, kwargs, rank=hparams.rank + 3)
        if call is None or call[2] is not None:
            return None  # a mask (Keras' ConvLSTMs take none) or other arguments: rnn.py
        x, initial_state, _ = call
        cell, dtype = layer.cell, x.dtype
        if hparams.go_backwards:
            x = tf.reverse(x, [1])
        u = tf.cast(cell.recurrent_kernel, dtype)
        a = _input_conv(x, tf.cast(cell.kernel, dtype), hparams)  # [B, T, *pixels, 4·filters]
        if hparams.use_bias:
            a += tf.cast(cell.bias, dtype)
        a = wrap(a)
        if initial_state is None:
            zeros = tf.zeros([tf.shape(x)[0]] + a.shape[2:-1].as_list() + [hparams.filters],
                             dtype)
            initial_state = [zeros, zeros]
        sequence, h_prev, _, final_states, last_output = time_loop(
            lambda a_t, states: _step(cell, u, a_t, states), a, list(initial_state))
        output = sequence if hparams.return_sequences else last_output
        if hparams.return_state:
            output = keras_bridge.rnn_call_result(output, list(final_states))
        return output, (x, h_prev), a

    def layer_result(self, call, hparams, layout):
        x, h_prev = call.inputs
        grad = call.grad_output
        num_steps = x.shape[1]
        if layout.examples_per_microbatch is not None and num_steps is not None:
            # The convolutions' rows per microbatch (their cost and memory choices).
            layout = dataclasses.replace(
                layout, examples_per_microbatch=layout.examples_per_microbatch * num_steps)
        inputs_part = _conv_norms(hparams.inputs, x, grad, layout)
        recurrent_part = _conv_norms(hparams.recurrent, h_prev, grad, layout)

        def clipped_sum(weights):
            kernel, *bias = inputs_part.clipped_sum(weights)
            recurrent = recurrent_part.clipped_sum(weights)[0]
            return [tf.reshape(kernel, hparams.kernel_shape),
                    tf.reshape(recurrent, hparams.recurrent_kernel_shape)] + bias

        return LayerResult(inputs_part.sq_norms + recurrent_part.sq_norms, clipped_sum,
                           ConvLSTMPath(inputs_part.path, recurrent_part.path))

    def merge_calls(self, calls):
        return merge_calls_on_time_axis(self, calls)


def _keras_cell_class():
    """The cell class Keras' ConvLSTM layers create (both Kerases define it in the module of
    the layers' base class), so that a replaced cell takes rnn.py's VJP."""
    base = keras.layers.ConvLSTM2D.__bases__[0]
    return getattr(sys.modules[base.__module__], "ConvLSTMCell", None)


def _compute_dtype(layer):
    dtype = getattr(layer, "compute_dtype", None) or getattr(layer, "dtype", "float32")
    return tf.as_dtype(dtype).name


def _conv(name, kernel_shape, strides, dilation, padding, use_bias):
    """The convolution handler's hyperparameters of one of the two convolutions (the Conv2D
    of height 1 for a ConvLSTM1D)."""
    *kernel_size, _, filters = kernel_shape
    if len(kernel_size) == 3:
        return Conv3DHyperparameters(name, tuple(kernel_size), strides, padding, use_bias,
                                     tuple(kernel_shape), 1, dilation)
    if len(kernel_size) == 1:
        kernel_size, strides, dilation = [1] + kernel_size, (1,) + strides, (1,) + dilation
        kernel_shape = (1,) + tuple(kernel_shape)
    return Conv2DHyperparameters(name, tuple(kernel_size), strides, dilation, padding,
                                 filters, use_bias, tuple(kernel_shape))


def _input_conv(x, kernel, hparams):
    """conv(x_t, W) of every step at once: [B, T, *pixels, C] → [B, T, *out pixels, 4·filters]."""
    rows = tf.reshape(x, [-1] + x.shape[2:].as_list())
    z = tf.nn.convolution(rows, kernel, strides=list(hparams.strides),
                          padding=hparams.padding.upper(), dilations=list(hparams.dilation_rate))
    num_steps = x.shape[1] if x.shape[1] is not None else tf.shape(x)[1]
    return tf.reshape(z, [-1, num_steps] + z.shape[1:].as_list())


def _step(cell, u, a_t, states):
    """One ConvLSTM step from a_t = conv(x_t, W) + b: (output, new states, no extras)."""
    h_tm1, c_tm1 = states
    z = a_t + tf.nn.convolution(h_tm1, u, padding="SAME")
    z_i, z_f, z_c, z_o = tf.split(z, 4, axis=-1)
    act, rec = cell.activation, cell.recurrent_activation
    c = rec(z_f) * c_tm1 + rec(z_i) * act(z_c)
    h = rec(z_o) * act(c)
    return h, [h, c], ()


def _conv_norms(conv, inputs, grad, layout):
    """One convolution's LayerResult from [B, T, ...] inputs and output gradients, as the
    B·T rows (example-major) of the convolution handler."""
    as_rows = lambda t: tf.reshape(t, [-1] + t.shape[2:].as_list())
    x, g = as_rows(inputs), as_rows(grad)
    if isinstance(conv, Conv3DHyperparameters):
        return _CONV3D.layer_result(_rows_call(x, g), conv, layout)
    if x.shape.rank == 3:  # ConvLSTM1D: [rows, 1, L, C]
        x, g = x[:, None], g[:, None]
    return _CONV2D.layer_result(_rows_call(x, g), conv, layout)


def _rows_call(x, g):
    """A recorded call of the convolution handlers: rows x, output gradients g."""
    return types.SimpleNamespace(layer=None, inputs=x, grad_output=g)


_CONV2D = Conv2DHandler()
_CONV3D = Conv3DHandler()
