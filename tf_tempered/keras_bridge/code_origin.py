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
"""Whether code is TensorFlow's or Keras' own: a class of either Keras, a source file of
their packages, a Model's ``train_step`` on the stack. Read from modules' names
(``keras.`` / ``tf_keras.``), files' paths and frames: Keras marks none of them.

>>> is_keras_class(keras.layers.Dense)
True
>>> class Mine(keras.layers.Dense):
...     pass
>>> is_keras_class(Mine), keras_class_named(Mine(2), ("Dense",))
(False, True)
>>> is_library_file(keras.layers.Dense.call.__code__.co_filename), is_library_file(__file__)
(True, False)
"""

import os
import sys

from tf_tempered._compat import keras

__all__ = ["computing_a_mask", "first_frame_level", "is_keras_class", "is_library_file",
           "keras_class_named", "traced_by_a_fit"]

_KERAS_MODULES = ("keras.", "tf_keras.")
_LIBRARIES = ("tensorflow", "keras", "tf_keras")


def is_keras_class(cls):
    """Whether ``cls`` is defined in either Keras' package."""
    return getattr(cls, "__module__", "").startswith(_KERAS_MODULES)


def keras_class_named(layer, names):
    """Whether ``layer`` is, or subclasses, a Keras class whose name is in ``names`` (a
    class of either Keras, matched by name: the two define the same layers apart)."""
    return any(cls.__name__ in names and is_keras_class(cls) for cls in type(layer).__mro__)


def is_library_file(path, packages=_LIBRARIES):
    """Whether the source file ``path`` is in one of ``packages`` (imported ones; by
    default TensorFlow's and either Keras')."""
    return os.path.abspath(path).startswith(_package_dirs(packages))


def _package_dirs(packages):
    return tuple(os.path.dirname(os.path.abspath(sys.modules[name].__file__)) + os.sep
                 for name in packages if getattr(sys.modules.get(name), "__file__", None))


def first_frame_level(test):
    """How far up the stack the first frame ``test(frame)`` holds for is, counted as a
    ``stacklevel`` of the function that calls ``first_frame_level`` (1: that function's
    caller; None: no frame).

    >>> def helper():
    ...     return first_frame_level(lambda frame: frame.f_code.co_name == "user")
    >>> def user():
    ...     return helper()
    >>> user(), helper()
    (1, None)
    """
    frame, level = sys._getframe(2), 1  # pylint: disable=protected-access
    while frame is not None:
        if test(frame):
            return level
        frame, level = frame.f_back, level + 1
    return None


def traced_by_a_fit(model=None):
    """Whether a Keras Model's ``train_step`` (fit, train_on_batch; AutoGraph names its
    converted copy ``tf__train_step``), ``model``'s when given, is on the caller's stack."""
    def is_train_step(frame):
        owner = frame.f_locals.get("self")
        return (frame.f_code.co_name in ("train_step", "tf__train_step")
                and isinstance(owner, keras.Model) and (model is None or owner is model))
    return first_frame_level(is_train_step) is not None


def computing_a_mask():
    """Whether a Keras layer's own ``compute_mask`` is on the caller's stack: tf-keras'
    TimeDistributed asks its inner model for the mask by running every inner layer again on
    the [batch · time] rows, whose values are dropped (only the boolean mask is kept)."""
    def is_keras_compute_mask(frame):
        owner = frame.f_locals.get("self")
        return (frame.f_code.co_name == "compute_mask"
                and isinstance(owner, keras.layers.Layer) and is_keras_class(type(owner)))
    return first_frame_level(is_keras_compute_mask) is not None
