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
"""Stage 2 of the DP step: what this traced step will do, decided once per trace.

The DP settings (the model's own, else its DP optimizer's; a step without any is
refused: it would train without privacy), the replicas of a tf.distribute strategy,
the engine options for this trace (XLA: no native op), and the clipped-sum strategy.
"""

import dataclasses
from typing import Any

from tf_tempered._compat import check_same_keras
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import NotPrivateError
from tf_tempered.privacy.public_layers import refuse_data_fitted_layers
from tf_tempered.privacy.settings import model_dp_config
from tf_tempered.privacy.step import clipped_sum as clipped_sums
from tf_tempered.privacy.step.replicas import Replicas

__all__ = ["StepPlan", "plan_step", "require_dp_settings"]


def require_dp_settings(model):
    """The DPConfig the model trains with; NotPrivateError (with the fix) if it has none."""
    config = model_dp_config(model)
    if config is None:
        optimizer = keras_bridge.inner_optimizer(getattr(model, "optimizer", None))
        name = getattr(optimizer, "_tf_tempered_base", type(optimizer)).__name__
        raise NotPrivateError(
            f"make_private({model.name!r}) was called without DP settings, and the model is "
            f"compiled with {name}, which carries none: it would train "
            "WITHOUT differential privacy (no clipping, no noise). Fix: give the settings to "
            "make_private (make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)), or "
            "compile with a DP optimizer that carries them "
            "(tf_tempered.privacy.DPKerasSGDOptimizer(l2_norm_clip=..., "
            "noise_multiplier=..., learning_rate=...)).")
    return config


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One traced step's decisions: settings, replicas, options, clipped-sum strategy."""

    config: Any  # DPConfig
    replicas: Any  # Replicas
    options: Any  # EngineOptions, with native=False under XLA
    clipped_sum: Any  # clipped_sum.BookKeeping | SecondPass | Recompute
    multiplicity: int
    xla: bool

    @property
    def local_microbatches(self):
        """This replica's number of microbatches (None: one per example)."""
        return self.replicas.local_microbatches(self.config.num_microbatches)


def plan_step(model, state, *, check_optimizer=True):
    """The StepPlan of the step being traced; refuses what cannot be private.

    ``check_optimizer=False``: the update goes back to the caller (DPGradients), whose
    optimizer is not the model's.
    """
    config = require_dp_settings(model)
    refuse_data_fitted_layers(model, state.public_layers)
    replicas = Replicas(model)
    if check_optimizer:
        check_same_keras(model.optimizer, "The compiled optimizer")
        replicas.check_optimizer(keras_bridge.inner_optimizer(model.optimizer))
    multiplicity = state.augmentation_multiplicity
    if multiplicity > 1 and replicas.distributed:
        raise ValueError(
            f"augmentation_multiplicity={multiplicity} is not supported under a "
            "tf.distribute strategy with several replicas yet (a replica's share of the "
            "batch could split an example's copies). Fix: train on one replica, or call "
            "make_private without augmentation_multiplicity.")
    # Keras' jit_compile, or a loop's tf.function(jit_compile=True) tracing DPGradients.
    xla = keras_bridge.jit_compiled(model) or keras_bridge.in_xla_context()
    options = _xla_options(state.options) if xla else state.options
    strategy = clipped_sums.strategy_for(options.clipped_sum, model,
                                         norms_in_backward=options.norms_in_backward,
                                         native=options.native)
    return StepPlan(config, replicas, options, strategy, multiplicity, xla)


def _xla_options(options):
    """The options of an XLA-compiled step (jit_compile, and Keras 3's "auto" on a GPU):
    the same values by other kernels. The native Conv2D op has no XLA kernel, so the
    TF-ops paths; and no depthwise-backprop path unless forced (norm_path="depthwise"):
    XLA on CPU runs the depthwise filter backprop of the batch folded into channels
    far slower than image patches (measurements: docs/engine.md, "How each layer's path
    is chosen"); and the per-example VJP of a recurrent
    unit (layer_grads/rnn.py) by tf.map_fn: XLA does not compile the vectorized loop of
    an RNN's call (an If inside a while body; tests/test_conformance_xla.py)."""
    return dataclasses.replace(
        options, native=False,
        norm_path="auto" if options.norm_path == "native" else options.norm_path,
        depthwise_max_channel_pairs=0,  # a forced norm_path="depthwise" still takes it
        vectorize_recurrent=False)
