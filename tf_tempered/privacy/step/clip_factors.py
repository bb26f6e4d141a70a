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

:func:`fused_clip_factors` (``EngineOptions.fused_clipped_sum``): where a layer offers a
FusedClippedSum (a native Conv2D), the costliest one computes its own norms, the clip
factors of all (from the other layers' summed norms) and its clipped sum in one op, after
every other layer's norms; those factors are every layer's.

>>> import types
>>> layers = [types.SimpleNamespace(result=types.SimpleNamespace(sq_norms=tf.constant([9.0, 1.0])))]
>>> norm, finite, weights = clip_factors(layers, 2, l2_norm_clip=2.0)
>>> [round(float(c), 3) for c in weights.scale]
[0.667, 1.0]
"""

import dataclasses

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads.clip_weights import ClipWeights
from tf_tempered.privacy.layer_grads.contract import FusedPath, LayerResult

__all__ = ["clip_factors", "fused_clip_factors"]


def clip_factors(layers, num_microbatches, l2_norm_clip):
    """(‖g_m‖ [M], finite [M] in {0, 1}, ClipWeights c) from the layers' squared norms."""
    norm = tf.sqrt(_summed_sq_norms(layers, num_microbatches))
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    clip = tf.constant(l2_norm_clip, tf.float32)
    scale = tf.where(finite > 0, clip / tf.maximum(tf.where(finite > 0, norm, clip), clip), 0.0)
    return norm, finite, ClipWeights(scale, finite)


def fused_clip_factors(layers, num_microbatches, l2_norm_clip):
    """(‖g_m‖, finite, ClipWeights c, layers): as :func:`clip_factors`, with the costliest
    layer that offers a FusedClippedSum run fused (its result then holds the norms and
    clipped sum its op gave); ``layers`` unchanged when none does.

    >>> from tf_tempered.privacy.layer_grads.contract import FusedClippedSum
    >>> from tf_tempered.privacy.step.norms import CoveredLayer
    >>> def run(other, clip):  # a stand-in for the native op: its own norms are 16 and 0
    ...     own = tf.constant([16.0, 0.0])
    ...     return own, clip / tf.maximum(tf.sqrt(other + own), clip), [tf.constant(7.0)]
    >>> fused = CoveredLayer(None, [], LayerResult(None, None, fused=FusedClippedSum(run, 1)), [])
    >>> plain = CoveredLayer(None, [], LayerResult(tf.constant([9.0, 1.0]), None), [])
    >>> norm, _, weights, layers = fused_clip_factors([plain, fused], 2, l2_norm_clip=1.0)
    >>> norm.numpy().tolist(), [round(float(c), 3) for c in weights.scale]
    ([5.0, 1.0], [0.2, 1.0])
    >>> layers[1].result.sq_norms.numpy().tolist(), float(layers[1].result.clipped_sum(weights)[0])
    ([16.0, 0.0], 7.0)
    >>> layers[1].result.path
    FusedPath(of=None)
    """
    fusable = [i for i, layer in enumerate(layers) if layer.result.fused is not None]
    if not fusable:
        return (*clip_factors(layers, num_microbatches, l2_norm_clip), layers)
    index = max(fusable, key=lambda i: layers[i].result.fused.cost)
    chosen = layers[index]
    other_sq = _summed_sq_norms(layers[:index] + layers[index + 1:], num_microbatches)
    own_sq, scale, grads = chosen.result.fused.run(other_sq, l2_norm_clip)
    # The op's c_m came from the same float32 sum, root and quotient (cc/conv_clipped_sum.cc),
    # so it is finite exactly where this norm is.
    norm = tf.sqrt(other_sq + tf.cast(own_sq, tf.float32))
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    result = LayerResult(own_sq, lambda weights: grads, FusedPath(chosen.result.path),
                         chosen.result.variables)
    layers = list(layers)
    layers[index] = dataclasses.replace(chosen, result=result)
    return norm, finite, ClipWeights(scale, finite), layers


def _summed_sq_norms(layers, num_microbatches):
    sq_norm = tf.zeros([num_microbatches], tf.float32)
    for layer in layers:
        sq_norm += tf.cast(layer.result.sq_norms, tf.float32)
    return sq_norm
