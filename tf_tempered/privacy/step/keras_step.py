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
"""The DP step as Keras runs it: ``model.train_step`` of a private model.

Each stage is a small module of this package, called in order; data flows one way:

    batch → plan → forward (recorded, per-example losses) → backward (output gradients)
    → per-layer norms → clip factors → clipped sum → + noise, ÷ normaliser → optimizer
    → metrics and logs
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step import eager_passes
from tf_tempered.privacy.step.batch import unpack_batch
from tf_tempered.privacy.step.chunks import clipped_passes
from tf_tempered.privacy.step.metrics import step_logs, update_metrics
from tf_tempered.privacy.step.noise import noised_mean
from tf_tempered.privacy.step.plan import plan_step
from tf_tempered.privacy.step.update import apply_update

__all__ = ["train_step"]


# Not autograph-converted: the step has no data-dependent Python control flow, and
# conversion would re-wrap our own exception types in StagingError.
@tf.autograph.experimental.do_not_convert
def dp_gradients(model, data, *, losses=None):
    """(batch, chunks.Passes, [(ĝ, variable)]) of one DP step on ``data``.

    ``losses``: a Keras loss container to take the per-example losses from instead of the
    model's compiled loss (DPGradients).
    """
    state = get_state(model)
    plan = plan_step(model, state, check_optimizer=losses is None)
    batch = unpack_batch(data, xla=plan.xla,
                         input_shapes=keras_bridge.declared_input_shapes(model))
    # Stages 3-7 (forward, backward, norms, clip factors, clipped sum), on the whole
    # batch or chunk by chunk (EngineOptions.physical_batch_size); eagerly, as a function
    # traced for this step, whose graph the checks read (eager_passes).
    if tf.executing_eagerly():
        passes = eager_passes.traced_passes(model, state, data, losses)
    else:
        passes = clipped_passes(model, state, plan, batch, losses=losses)
    stats = plan.replicas.sum(passes.local_stats)
    update = noised_mean(model, state, plan, batch, passes, passes.summed, stats)
    update_metrics(model if losses is None else None, state.metrics, stats, plan.replicas)
    return batch, passes, update


@tf.autograph.experimental.do_not_convert
def train_step(model, data):
    """One DP-SGD step on ``data``; returns the logs (Keras' ``train_step`` contract)."""
    batch, passes, update = dp_gradients(model, data)
    apply_update(model, update)
    return step_logs(model, get_state(model).metrics, batch, passes.y_pred)
