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
"""LayerNormalization and GroupNormalization: per-example gradients in closed form.

Both compute, per example, y = γ ⊙ x̂ + β, with x̂ the input normalized over that
example's own values and γ, β broadcast along the axes they do not span. So each
output element depends on one entry of γ (one of β), linearly, and example b's
gradients are

    ∂L_b/∂γ = Σ_p g[b, p] · x̂[b, p],      ∂L_b/∂β = Σ_p g[b, p]

summed over the positions p that share a γ entry (g: the output gradient). x̂ is
∂y/∂γ in the direction of ones, taken by forward-mode differentiation of the layer's
own call: no re-implementation of Keras' variants (fused kernels, RMS scaling, dtype
casts), one extra layer forward. Keras 3's plain LayerNormalization instead gives x̂
from its own op called without γ and β (keras_bridge.layer_normalized_input): one
normalization, not a forward pass and its tangent (a third of the elementwise passes).
β enters additively in both Kerases (they create it only then), so its direction is 1
and its gradient Σ_p g[b, p] needs no forward pass.
"""

import dataclasses
from typing import Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads.contract import Handler
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.generic import norms_from_per_example

__all__ = ["AffineNormalizationHandler", "AffineNormalizationHyperparameters",
           "broadcast_weight_grads"]


@dataclasses.dataclass(frozen=True)
class AffineNormalizationHyperparameters:
    """The input axes γ and β span (negative: from the end), and their variables' names."""
    axes: Tuple[int, ...]
    variable_names: Tuple[str, ...]


@register(keras.layers.LayerNormalization, keras.layers.GroupNormalization)
class AffineNormalizationHandler(Handler):
    """Per-example γ and β gradients from x̂ = ∂y/∂γ·1 and the output gradient."""

    name = "normalization"
    summary = ("LayerNormalization, GroupNormalization: per-example γ gradients Σ g·x̂ and β "
               "gradients Σ g in closed form, x̂ from Keras 3's layer-normalization op without "
               "γ and β, else by forward-mode differentiation of the layer's own call; "
               "materialized per microbatch ([M, channels]), matrix-vector clipped sum")

    def hyperparameters(self, layer):
        axis = layer.axis
        axes = tuple(int(a) for a in (axis if isinstance(axis, (list, tuple)) else [axis]))
        variables = [getattr(layer, name, None) for name in ("gamma", "beta")]
        variables = [v for v in variables if v is not None]
        shapes = {keras_bridge.shape_of(v) for v in variables}
        if not variables or len(shapes) != 1 or len(next(iter(shapes))) != len(axes):
            return None  # an unexpected variant: the generic VJP
        return AffineNormalizationHyperparameters(axes, tuple(v.name for v in variables))

    def variables(self, layer, hparams):
        return [v for v in (getattr(layer, "gamma", None), getattr(layer, "beta", None))
                if v is not None]

    def layer_result(self, call, hparams, layout):
        variables = self.variables(call.layer, hparams)
        beta = getattr(call.layer, "beta", None)
        additive = {keras_bridge.variable_key(beta): 1.0} if beta is not None else {}
        gamma = getattr(call.layer, "gamma", None)
        directions = {}
        if gamma is not None:
            normalized = keras_bridge.layer_normalized_input(call.layer, call.inputs)
            if normalized is not None:
                directions[keras_bridge.variable_key(gamma)] = normalized
        return norms_from_per_example(variables, broadcast_weight_grads(
            call, variables, hparams.axes, additive=additive, directions=directions),
            layout, "closed_form")


def broadcast_weight_grads(call, variables, axes, additive=None, directions=None):
    """Per-example gradients [B, *var.shape] of weights broadcast over the input's other axes.

    For a layer whose output element y[b, p] depends on one entry of each variable (the
    entry at p's coordinates along `axes`, the input axes the variables span; () for
    scalars), example b's gradient is Σ_p g[b, p]·∂y[b, p]/∂w, summed over the positions
    sharing an entry; ∂y/∂w · ones comes from forward-mode differentiation of the
    layer's own call (one extra forward pass per variable). ``additive`` maps the
    variable keys (keras_bridge.variable_key) of weights that enter y as ± w to that
    sign: their direction is the constant sign, so Σ_p sign·g[b, p] needs no forward
    pass (and leaves Grappler no constant [B, ...] direction to fold and hold).
    ``directions`` maps variable keys to ∂y/∂w · ones already at hand (the output's
    shape), used instead of the forward-mode pass.
    """
    x = call.inputs
    rank = x.shape.rank
    spanned = {a % rank for a in axes}
    summed_axes = [a for a in range(1, rank) if a not in spanned]
    additive, directions = additive or {}, directions or {}
    per_example = []
    for var in variables:
        sign = additive.get(keras_bridge.variable_key(var))
        given = directions.get(keras_bridge.variable_key(var))
        if sign is not None:
            g = tf.cast(call.grad_output, var.dtype)
            direction = tf.constant(sign, var.dtype)  # a scalar: broadcast, not folded
        elif given is not None:
            direction = tf.convert_to_tensor(given)
            g = tf.cast(call.grad_output, direction.dtype)
        else:
            # ∂y/∂var · ones (x̂ for γ).
            watched = keras_bridge.watchable(var)
            with tf.autodiff.ForwardAccumulator(watched, tf.ones_like(watched)) as acc:
                y = call.call_fn(x, *call.call_args, **call.call_kwargs)
            direction = acc.jvp(y, unconnected_gradients=tf.UnconnectedGradients.ZERO)
            g = tf.cast(call.grad_output, direction.dtype)
        grad = tf.reduce_sum(g * direction, axis=summed_axes) if summed_axes else g * direction
        # grad is [B, spanned dims in input order]. Both Kerases reshape (not transpose)
        # a variable whose dims follow an out-of-order axis list (e.g. [-1, 1]) onto
        # the input's dims, so a reshape maps the entries back.
        per_example.append(tf.cast(tf.reshape(grad, [-1] + list(var.shape)), var.dtype))
    return per_example
