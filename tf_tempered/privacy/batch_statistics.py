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
"""Batch normalization in training mode mixes examples: refused at its call.

In training mode BatchNormalization normalizes x_i with the batch's mean and variance,
so example i's output (and every gradient below it) depends on the other examples and
clipping per example no longer bounds one example's influence. In inference mode
(``training=False``) it is x ↦ γ·(x − μ̂)/√(σ̂² + ε) + β with the moving statistics
μ̂, σ̂²: a per-channel affine map, per example, whose γ and β the generic path trains
exactly. The recording hook (:mod:`.recording`) checks each call while a DP step traces.
Layers that blend examples of the batch (Keras 3's MixUp and CutMix) are refused outright.
"""

import numpy as np

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["refuse_in_training_mode", "error", "mixing_error"]


def refuse_in_training_mode(layer, args, kwargs):
    """Raises UnsupportedLayerError for a trainable BatchNormalization called in training
    mode. Called with ``training=False`` (Keras' fine-tuning guide: ``base_model(x,
    training=False)`` with the base unfrozen) it normalizes each example with the moving
    statistics, a per-channel affine map whose γ and β have per-example gradients."""
    if not keras_bridge.is_trainable_batch_norm(layer):
        return
    training = kwargs.get("training", args[0] if args else None)
    if training is not None and not isinstance(training, (bool, np.bool_)):
        training = tf.get_static_value(training)  # a constant tensor; None if symbolic
    if training is not None and not training:
        return
    raise error(layer)


def error(layer):
    """The UnsupportedLayerError of a BatchNormalization in training mode, with the fixes."""
    return UnsupportedLayerError(
        f"Layer {layer.name!r} is a BatchNormalization layer called in training mode: it "
        "normalizes with statistics of the whole batch, so one example's gradient depends "
        "on the others and per-example clipping no longer bounds its influence (DP-SGD's "
        "guarantee fails). Replace it with keras.layers.GroupNormalization or "
        "keras.layers.LayerNormalization, freeze it (layer.trainable = False) so it uses its "
        "moving statistics, or keep it in inference mode while its γ and β train: call the "
        "model that holds it with training=False (e.g. base_model(inputs, training=False), "
        "as in Keras' fine-tuning guide; on Keras 3, in a subclassed model's call: a "
        "Functional model passes its own training=True to the models it nests).")


def mixing_error(layer):
    """The UnsupportedLayerError of a layer that blends examples of the batch (MixUp)."""
    return UnsupportedLayerError(
        f"Layer {layer.name!r} ({type(layer).__name__}) blends each example with another "
        "example of the batch when training: one example's data enters the others' "
        "gradients, so per-example clipping no longer bounds its influence (DP-SGD's "
        "guarantee fails). Fix: remove it from the private model; augment each example on "
        "its own instead (RandomFlip, RandomCrop, RandomRotation, ... or "
        "tf_tempered.augment.augmult_batches).")
