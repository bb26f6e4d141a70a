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
"""The first backward pass's per-layer norms, computed inside it (clipped_sum="second_pass",
"recompute", and "bookkeeping" with EngineOptions.norms_in_backward, the default).

Each layer's norms are computed as soon as its output gradient is known, and the gradient
flows on to the layers below only once they are done, so TensorFlow's executor cannot run
the cheap input-gradient chain ahead and hold every layer's output gradient at once.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import custom_gradients
from tf_tempered.privacy.layer_grads import clip_weights as clip

__all__ = ["NormHooks"]


class NormHooks:
    """Per-layer norms computed in the first backward pass, one layer after the other.

    ``wrap(record, output)`` (called while recording) returns ``output`` through an
    identity whose gradient, while ``collecting`` (the first backward pass only), sets
    ``record.grad_output``, computes ``record.handler.layer_result(...)`` into ``results`` and
    passes the gradient on only after them. Records of layers called more than once
    (``skip``: their norms need every call's gradient), and those ``inside(record)`` is
    False for, pass the gradient straight on (their norms are computed afterwards).
    """

    def __init__(self, inside=None):
        # record -> whether its norms are computed inside the backward pass (None: all).
        self.inside = inside
        self.layout = None  # layer_grads.MicrobatchLayout, set before the first backward pass
        self.skip = set()  # ids of records whose norms are computed afterwards
        self.collecting = False
        self.results = {}  # id(record) -> the handler's norms object

    def wrap(self, record, output):
        if not isinstance(output, tf.Tensor):
            return output

        @tf.custom_gradient
        def hook(x):
            def grad(dy):
                if (not self.collecting or id(record) in self.skip
                        or self.inside is not None and not self.inside(record)):
                    return dy
                record.grad_output = clip.widen(dy)
                record.inputs = tf.nest.map_structure(clip.widen, record.inputs)
                layer_norms = record.handler.layer_result(record, record.hparams, self.layout)
                self.results[id(record)] = layer_norms
                if layer_norms.fused is not None:
                    # Its norms may come from the fused op after the backward pass: a
                    # dependency here would run the separate norms op for nothing.
                    return dy
                with tf.control_dependencies([layer_norms.sq_norms]):
                    return tf.identity(dy)
            return tf.identity(x), grad

        with tf.name_scope(custom_gradients.ENGINE_SCOPE):  # the engine's own (not refused)
            return hook(output)
