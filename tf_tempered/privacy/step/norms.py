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
"""Stage 5 of the DP step: each layer's handler result (per-microbatch squared norms).

Layer ℓ's handler gives ‖g_m^ℓ‖² for every microbatch m from the recorded tensors (see
:mod:`tf_tempered.privacy.layer_grads`), and the function of the clip factors that gives
its part of the clipped sum (:mod:`.clip_factors` turns the norms into the factors).
"""

import dataclasses
import logging
from typing import Any, List

from tf_tempered.privacy import layer_grads, layer_report

__all__ = ["CoveredLayer", "keep_layer_paths", "layer_norms"]

_LOG = logging.getLogger("tf_tempered.privacy.engine")


@dataclasses.dataclass(frozen=True)
class CoveredLayer:
    """One layer's result: its handler's LayerResult and the variables its clipped sum covers."""

    first: Any  # the layer's first LayerRecord
    calls: List[Any]
    result: Any  # layer_grads.LayerResult
    variables: List[Any]


def _norms_of(first, calls, layout, hooks):
    if hooks is not None and id(first) in hooks.results:
        return hooks.results[id(first)]  # computed inside the backward pass
    if len(calls) == 1:
        return first.handler.layer_result(first, first.hparams, layout)
    return layer_grads.multi_call.multi_call_norms(calls, layout)


def layer_norms(model, state, groups, layout, hooks):
    """[CoveredLayer] of every recorded layer."""
    _log_generic_layers(state, [first for first, _ in groups])
    result = []
    for first, calls in groups:
        norms = _norms_of(first, calls, layout, hooks)
        variables = (norms.variables if norms.variables is not None
                     else first.handler.variables(first.layer, first.hparams))
        result.append(CoveredLayer(first, calls, norms, variables))
    return result


def keep_layer_paths(state, layers):
    """Each layer's handler and path (after the clip factors: one may have run fused), for
    layer_paths."""
    state.layer_paths = layer_report.describe([(layer.first, layer.calls) for layer in layers],
                                              [layer.result for layer in layers])


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

