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
"""Stage 6 of the DP step: the clip factors of the microbatches, from their layers' norms.

A microbatch's gradient norm and clip factor are

    ‖g_m‖ = √(Σ_ℓ ‖g_m^ℓ‖²),    c_m = C / max(‖g_m‖, C)   (TF Privacy's clip_by_global_norm),

and c_m = 0 where ‖g_m‖ is not finite (that microbatch contributes nothing, counted in
``dp_nonfinite``).

>>> import types
>>> layers = [types.SimpleNamespace(result=types.SimpleNamespace(sq_norms=tf.constant([9.0, 1.0])))]
>>> norm, finite, weights = clip_factors(layers, 2, l2_norm_clip=2.0)
>>> [round(float(c), 3) for c in weights.scale]
[0.667, 1.0]
"""

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads.clip_weights import ClipWeights

__all__ = ["clip_factors"]


def clip_factors(layers, num_microbatches, l2_norm_clip):
    """(‖g_m‖ [M], finite [M] in {0, 1}, ClipWeights c) from the layers' squared norms."""
    sq_norm = tf.zeros([num_microbatches], tf.float32)
    for layer in layers:
        sq_norm += tf.cast(layer.result.sq_norms, tf.float32)
    norm = tf.sqrt(sq_norm)
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    clip = tf.constant(l2_norm_clip, tf.float32)
    scale = tf.where(finite > 0, clip / tf.maximum(tf.where(finite > 0, norm, clip), clip), 0.0)
    return norm, finite, ClipWeights(scale, finite)
