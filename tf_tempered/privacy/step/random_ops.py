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
"""Refusals of clipped_sum="recompute": its second forward pass must compute what the first did.

Layers that draw random numbers when called (Dropout, GaussianNoise, random augmentation)
are refused when the model is made private; random ops a traced forward pass adds (custom
layers calling ``tf.random``) when the step is traced. What else the second pass must share
with the first: :mod:`tf_tempered.privacy.step.second_pass_checks`.
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import random_draws

__all__ = ["ForwardOps", "refuse_random_layers", "refuse_random_ops"]

_RECOMPUTE_FIX = ("Fix: use EngineOptions.low_memory(clipped_sum=\"second_pass\") (one forward "
                  "pass; the activations are kept for the second backward pass) or the default "
                  "EngineOptions(), or remove the random layers.")


def refuse_random_layers(model):
    """Raises ValueError if ``model`` has layers that draw random numbers when called:
    a second forward pass would not reproduce the first (clipped_sum="recompute")."""
    layers = keras_bridge.random_layers(model)
    if layers:
        _refuse("these layers draw random numbers",
                [f"{layer.name} ({type(layer).__name__})" for layer in layers])


def _refuse(what, names):
    raise ValueError(
        f"EngineOptions(clipped_sum=\"recompute\") runs the forward pass twice and needs both "
        f"to compute the same function, but {what}: {', '.join(names[:5])}. {_RECOMPUTE_FIX}")


class ForwardOps:
    """The ops a forward pass adds to the graph being traced (none eagerly)."""

    def __init__(self):
        self._graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        self._start = len(self._graph.get_operations()) if self._graph is not None else 0

    def new_ops(self):
        return [] if self._graph is None else self._graph.get_operations()[self._start:]


def refuse_random_ops(ops):
    """Raises ValueError if a traced forward pass draws random numbers
    (clipped_sum="recompute"; catches custom layers that call ``tf.random`` directly)."""
    random_ops = random_draws.fresh_draws(ops)  # in function bodies too
    if random_ops:
        _refuse("the forward pass draws random numbers",
                [f"{op.name} ({op.type})" for op in random_ops])
