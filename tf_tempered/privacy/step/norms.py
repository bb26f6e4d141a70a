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
"""Stage 4 of the DP step: each layer's per-microbatch squared norms, and the clip factors.

Layer ℓ's handler gives ‖g_m^ℓ‖² for every microbatch m from the recorded tensors (see
:mod:`tf_tempered.privacy.layer_grads`); a microbatch's gradient norm is

    ‖g_m‖ = √(Σ_ℓ ‖g_m^ℓ‖²),    c_m = C / max(‖g_m‖, C)   (TF Privacy's clip_by_global_norm),

and c_m = 0 where ‖g_m‖ is not finite (that microbatch contributes nothing, counted in
``dp_nonfinite``).
"""

import dataclasses
import logging
from typing import Any, List

from tf_tempered._compat import tf
from tf_tempered.privacy import layer_grads, layer_report
from tf_tempered.privacy.layer_grads.clip_weights import ClipWeights

__all__ = ["LayerNorms", "layer_norms", "clip_factors"]

_LOG = logging.getLogger("tf_tempered.privacy.engine")


@dataclasses.dataclass(frozen=True)
class LayerNorms:
    """One layer's result: its handler's LayerResult and the variables its clipped sum covers."""

    first: Any  # the layer's first LayerRecord
    calls: List[Any]
    norms: Any  # layer_grads.LayerResult
    variables: List[Any]


def _norms_of(first, calls, step, hooks):
    if hooks is not None and id(first) in hooks.norms:
        return hooks.norms[id(first)]  # computed inside the backward pass
    if len(calls) == 1:
        return first.handler.norms(first, first.params, step)
    return layer_grads.multi_call.multi_call_norms(calls, step)


def layer_norms(model, state, groups, step, hooks):
    """[LayerNorms] of every recorded layer (each handler's path is kept for layer_paths)."""
    _log_generic_layers(state, [first for first, _ in groups])
    result = []
    for first, calls in groups:
        norms = _norms_of(first, calls, step, hooks)
        variables = (norms.variables if norms.variables is not None
                     else first.handler.variables(first.layer, first.params))
        result.append(LayerNorms(first, calls, norms, variables))
    state.layer_paths = layer_report.describe(groups, [r.norms for r in result])
    return result


def clip_factors(layers, num_microbatches, l2_norm_clip):
    """(‖g_m‖ [M], finite [M] in {0, 1}, ClipWeights c) from the layers' squared norms."""
    sq_norm = tf.zeros([num_microbatches], tf.float32)
    for layer in layers:
        sq_norm += tf.cast(layer.norms.sq_norms, tf.float32)
    norm = tf.sqrt(sq_norm)
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    clip = tf.constant(l2_norm_clip, tf.float32)
    scale = tf.where(finite > 0, clip / tf.maximum(tf.where(finite > 0, norm, clip), clip), 0.0)
    return norm, finite, ClipWeights(scale, finite)


def _log_generic_layers(state, records):
    """Logs once per model (at the first trace) which layers take the generic VJP fallback."""
    if state.generic_logged:
        return
    state.generic_logged = True
    names = [f"{r.layer.name} ({type(r.layer).__name__})" for r in records
             if r.handler is layer_grads.GENERIC or r.handler.vjp_of_own_call]
    if names:
        _LOG.info("tf_tempered: per-example gradients by the generic per-layer VJP (no "
                  "handler of their own; a recurrent layer as one unit) for: %s",
                  ", ".join(names))

