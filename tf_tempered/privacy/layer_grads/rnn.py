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
"""Recurrent layers (RNN of other cells, what rnn_rows.py and conv_lstm.py decline) as one unit.

A recurrent layer uses its cell's weights at every time step, inside its time
loop (Keras 3, tf-keras' non-fused path) or in a fused kernel that never calls
the cell (tf-keras' LSTM/GRU with their default settings): what the cell saw
cannot be recorded. The engine records the call of the outer layer instead (its
input, mask and initial states, and the gradient of each of its outputs) and
owns all its sub-layers' weights through it (keras_bridge.is_recurrent_unit).
An example's gradient of those weights is the VJP of the whole call for that
example alone,

    g_i = J_W(f(x_i, mask_i, state0_i; W))ᵀ δ_i,

(vectorized over the batch, generic.per_example_grads), exact because an RNN
treats examples independently. Refused, with the fix: stateful=True (the state
carries one batch over to the next), time_major=True (examples not on axis 0),
dropout/recurrent_dropout > 0 (the per-example recompute would draw other
masks than the forward pass, a different gradient). A custom cell drawing
random numbers of its own in training is not detected: keep its call
deterministic (dropout outside the RNN layer).
"""

from tf_tempered._compat import keras
from tf_tempered.privacy.errors import UnsupportedLayerError
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import generic
from tf_tempered.privacy.layer_grads.contract import Handler, NoHyperparameters
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["RecurrentHandler"]

# Sub-layers whose training-mode call draws random numbers.
_RANDOM_LAYERS = (keras.layers.Dropout, keras.layers.GaussianNoise, keras.layers.GaussianDropout,
                  keras.layers.AlphaDropout)


@register(keras.layers.RNN)
class RecurrentHandler(Handler):
    """Per-example VJP of the whole recurrent layer call (its cells are not recorded)."""

    name = "rnn"
    summary = ("the whole layer as one unit, its cells' weights included (RNN of a custom or "
               "stacked cell, subclasses with a call of their own, and what rnn_rows and "
               "conv_lstm decline: a dtype policy casting the weights, a ConvLSTM called with a "
               "mask or channels_first; in Bidirectional too): a per-example VJP of its call "
               "with its mask "
               "and initial states (vectorized on Keras 3; a tf.map_fn on Keras 2 or with "
               "EngineOptions(vectorize_recurrent=False)), logged with the generic layers")
    vjp_of_own_call = True
    slices_call_args = True

    @staticmethod
    def per_example_while_loop(options):
        """Whether the per-example VJP is a tf.map_fn (else TF's vectorized_map)."""
        # Where vectorized_map cannot run the layer (tf-keras' fused kernels): tf.map_fn.
        return not keras_bridge.vectorized_map_takes_recurrent_layers() or (
            not options.vectorize_recurrent)

    def hyperparameters(self, layer):
        _refuse_unsupported(layer)
        return NoHyperparameters()

    def variables(self, layer, hparams):
        return keras_bridge.own_trainable_weights(layer)

    def layer_result(self, call, hparams, layout):
        variables = keras_bridge.own_trainable_weights(call.layer)
        return generic.norms_from_per_example(
            variables, generic.per_example_grads(call, variables, options=layout.options), layout,
            "rnn")


def _refuse_unsupported(layer):
    what = f"Recurrent layer {layer.name!r} ({type(layer).__name__})"
    for sub in keras_bridge.flatten_layers(layer, include_self=True):
        if getattr(sub, "stateful", False):
            raise UnsupportedLayerError(
                f"{what} is stateful (stateful=True): its state carries one batch's examples "
                "over to the next batch, so an example's gradient depends on other examples "
                "and DP-SGD's per-example clipping does not bound its influence. Fix: "
                "stateful=False (pass the state explicitly as initial_state if needed).")
        if getattr(sub, "time_major", False):
            raise UnsupportedLayerError(
                f"{what} is time-major (time_major=True): the DP engine needs the examples "
                "on axis 0. Fix: time_major=False (the default), with inputs of shape "
                "[batch, time, ...].")
        rates = {name: getattr(sub, name, 0) for name in ("dropout", "recurrent_dropout")}
        if isinstance(sub, _RANDOM_LAYERS):
            rates[type(sub).__name__] = getattr(sub, "rate", getattr(sub, "stddev", 1))
        for name, rate in rates.items():
            if isinstance(rate, (int, float)) and rate > 0:
                raise UnsupportedLayerError(
                    f"{what} has {name}={rate} (in {sub.name!r}): its per-example gradients "
                    "are recomputed per example, which would draw other dropout masks than "
                    "the forward pass and give a different gradient. Fix: set dropout=0 and "
                    "recurrent_dropout=0 and put a keras.layers.Dropout (or "
                    "SpatialDropout1D) before or after the recurrent layer instead.")
