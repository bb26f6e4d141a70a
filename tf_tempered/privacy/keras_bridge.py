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
"""The DP engine's one door into Keras internals (tf-keras, Keras 2).

Everything the engine reads or sets on Keras objects beyond their public API
goes through here, so that a Keras 3 adapter replaces this module only: the
handlers in `layer_grads/` take plain tensors and numbers.
"""

from tf_tempered._compat import keras

__all__ = ["flatten_layers", "is_trainable_batch_norm", "linear_activation",
           "own_trainable_weights", "set_untracked", "unpack_x_y_sample_weight"]


def flatten_layers(model, include_self=False):
    """Every layer of `model`, nested ones included (Keras' own traversal)."""
    # pylint: disable-next=protected-access
    return model._flatten_layers(include_self=include_self, recursive=True)


def own_trainable_weights(layer):
    """The trainable weights `layer` created itself (not its sub-layers'); [] if frozen."""
    return list(getattr(layer, "_trainable_weights", [])) if layer.trainable else []


def set_untracked(obj, name, value):
    """Sets an attribute bypassing Keras' tracking: weight order, sub-layer lists
    and checkpoints stay as they were."""
    object.__setattr__(obj, name, value)


def unpack_x_y_sample_weight(data):
    return keras.utils.unpack_x_y_sample_weight(data)


def is_trainable_batch_norm(layer):
    return isinstance(layer, keras.layers.BatchNormalization) and layer.trainable


linear_activation = keras.activations.linear
