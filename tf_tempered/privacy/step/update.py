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
"""Stage 10 of fit's DP step: the optimizer applies ĝ.

The optimizer applies the noised mean ĝ with its own rule (SGD, Adam, ...); under mixed
precision the wrapped optimizer does, since ĝ comes from a loss nobody scaled. A custom
loop (DPGradients) applies ĝ itself.
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge

__all__ = ["apply_update"]


def apply_update(model, grads_and_vars):
    """Applies the DP update with the model's optimizer (the one a LossScaleOptimizer wraps),
    marked as the DP engine's so that a DP optimizer accepts it."""
    grads_and_vars = list(grads_and_vars)
    if not grads_and_vars:  # every layer frozen: nothing to update (Keras 3's optimizer
        return              # cannot apply an empty list; Keras skips the update too)
    optimizer = keras_bridge.inner_optimizer(model.optimizer)
    scale = keras_bridge.loss_scale_factor(optimizer)
    if scale is not None:  # Keras divides by it the gradients of a loss it scaled; ĝ is not
        grads_and_vars = [(grad * tf.cast(scale, grad.dtype), variable)
                          for grad, variable in grads_and_vars]
    keras_bridge.set_dp_mark(optimizer)
    optimizer.apply_gradients(grads_and_vars)
