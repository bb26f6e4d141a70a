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
"""Learnable TemperedSigmoid: per-example gradients of its scalar (s, T, o) in closed form.

φ(x) = s·σ(T·x) − o acts elementwise with scalar weights, so example b's gradient of
each weight w (the softplus-parametrized s and T, and o) is

    ∂L_b/∂w = Σ_p g[b, p] · ∂φ(x[b, p])/∂w

over the example's positions p (g: the output gradient), with ∂φ/∂w taken by
forward-mode differentiation of the layer's own call for s and T (normalization.py's
broadcast_weight_grads with no spanned axes) and ∂φ/∂o = −1: [B, 3] per-example
gradients, a cheap norm and a matrix-vector clipped sum, instead of the generic
vectorized VJP.

>>> from tf_tempered import TemperedSigmoid
>>> from tf_tempered.privacy import layer_grads
>>> layer = TemperedSigmoid(learnable=True)
>>> layer.build((None, 4))
>>> layer_grads.lookup(layer)[0].name
'tempered_sigmoid'
"""

from tf_tempered.layers import TemperedSigmoid
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads.contract import Handler, NoHyperparameters
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.generic import norms_from_per_example
from tf_tempered.privacy.layer_grads.normalization import broadcast_weight_grads

__all__ = ["TemperedSigmoidHandler"]


@register(TemperedSigmoid)
class TemperedSigmoidHandler(Handler):
    """Learnable (s, T, o): Σ_p g·∂φ/∂w per example, ∂φ/∂w by forward mode."""

    name = "tempered_sigmoid"
    summary = ("learnable (s, T, o) (scalar weights acting elementwise): per-example gradients "
               "Σ g·∂φ/∂w with ∂φ/∂w by forward-mode differentiation of the layer's own call; "
               "materialized per microbatch ([M, 3]), matrix-vector clipped sum")

    def hyperparameters(self, layer):
        weights = keras_bridge.own_trainable_weights(layer)
        if not layer.learnable or any(keras_bridge.shape_of(w) for w in weights):
            return None  # not scalars: the generic VJP
        return NoHyperparameters()

    def variables(self, layer, hparams):
        return keras_bridge.own_trainable_weights(layer)

    def layer_result(self, call, hparams, layout):
        variables = self.variables(call.layer, hparams)
        # φ = s·σ(T·x) − o: the offset's direction is −1 everywhere.
        offset = {keras_bridge.variable_key(call.layer.offset_variable): -1.0}
        return norms_from_per_example(variables, broadcast_weight_grads(
            call, variables, (), additive=offset), layout, "closed_form")
