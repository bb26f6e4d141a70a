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
"""Whether code is Keras' own: a class of either Keras, a layer whose ``call`` Keras wrote
(not a subclass's override), a Model's ``train_step`` on the stack. Read from modules'
names (``keras.`` / ``tf_keras.``) and from frames: Keras marks neither.

>>> is_keras_class(keras.layers.Dense)
True
>>> class Mine(keras.layers.Dense):
...     def call(self, inputs):
...         return super().call(inputs)
>>> is_keras_class(Mine), keras_own_call(Mine(2)), keras_own_call(keras.layers.Dense(2))
(False, False, True)
"""

import sys

from tf_tempered._compat import keras

__all__ = ["is_keras_class", "keras_class_named", "keras_own_call", "traced_by_a_fit"]

_KERAS_MODULES = ("keras.", "tf_keras.")


def is_keras_class(cls):
    """Whether ``cls`` is defined in either Keras' package."""
    return getattr(cls, "__module__", "").startswith(_KERAS_MODULES)


def keras_class_named(layer, names):
    """Whether ``layer`` is, or subclasses, a Keras class whose name is in ``names`` (a
    class of either Keras, matched by name: the two define the same layers apart)."""
    return any(cls.__name__ in names and is_keras_class(cls) for cls in type(layer).__mro__)


def keras_own_call(layer):
    """Whether ``layer``'s call is Keras' own code, not a subclass's (Keras 3's quantized
    Dense and EinsumDense take their inputs' gradient by a custom one, row by row)."""
    return is_keras_class(getattr(type(layer), "call", None))


def traced_by_a_fit():
    """Whether a Keras Model's ``train_step`` (fit, train_on_batch; AutoGraph names its
    converted copy ``tf__train_step``) is on the stack of the caller."""
    frame = sys._getframe(1)  # pylint: disable=protected-access
    while frame is not None:
        if (frame.f_code.co_name in ("train_step", "tf__train_step")
                and isinstance(frame.f_locals.get("self"), keras.Model)):
            return True
        frame = frame.f_back
    return False
