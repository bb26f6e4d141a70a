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
"""Which handler and path each trainable layer of a private model took: `layer_paths(model)`.

The engine records it each time it traces a DP step (`describe`), from the
handlers' decision objects (`LayerResult.path`), so benchmarks and users can see, e.g.,
whether a Conv2D took the native op or ghost norms.
"""

from tf_tempered.privacy import layer_grads
from tf_tempered.privacy.state import get_state

__all__ = ["layer_paths", "describe"]


def describe(groups, norms):
    """The handler and path of each layer of the step being traced (kept in PrivateState).

    groups: [(first record, all records of that layer)], norms: each group's LayerResult.
    """
    return [{"layer": first.layer.name, "class": type(first.layer).__name__,
             "handler": first.handler.name if len(calls) == 1 else "multi_call",
             "path": layer_grads.describe_path(n.path)}
            for (first, calls), n in zip(groups, norms)]


def layer_paths(model):
    """Which handler and path each trainable layer took in the model's last traced DP step.

    A list of dicts ``{"layer", "class", "handler", "path"}`` in recording order
    (``path``: :func:`tf_tempered.privacy.layer_grads.describe_path`; choices made per
    step, e.g. for a batch size unknown while tracing, read "per step"). Raises
    ValueError before the first training step of a model prepared by make_private.
    """
    state = get_state(model)
    paths = state.layer_paths if state is not None else None
    if paths is None:
        raise ValueError(f"model {getattr(model, 'name', model)!r} has no traced DP step yet: "
                         "call tf_tempered.make_private(model), compile it with a DP optimizer "
                         "(or DP settings) and train one step (fit or train_on_batch) first.")
    return [dict(p) for p in paths]
