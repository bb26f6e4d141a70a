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
"""Backward-compatible alias: the tempered sigmoid for Keras 3, now in the main modules.

Before tf_tempered ran on Keras 3 by default, this module held a separate Keras 3
implementation. ``tf_tempered.tempered_sigmoid`` and ``tf_tempered.TemperedSigmoid``
(also in ``tf_tempered.activations`` / ``tf_tempered.layers``) are now the objects of
the active Keras, so on Keras 3 (the default) this module gives exactly those
objects: ``tf_tempered.keras3.TemperedSigmoid is tf_tempered.TemperedSigmoid``. New
code need not import it.

With Keras 2 selected (``TF_USE_LEGACY_KERAS=1``) the module still imports (so tools
that import every module keep working), but ``from tf_tempered.keras3 import
TemperedSigmoid`` (or any use of its names) raises ImportError with the fix: Keras 3
objects cannot be used with the Keras 2 models, optimizers and DP engine of that
process (tf_tempered refuses to mix the two Kerases), so rather than hand out objects
nothing else in the process accepts, it says to use ``tf_tempered.TemperedSigmoid``
(the Keras 2 layer there) or to unset the variable to use Keras 3.

>>> import tf_tempered
>>> from tf_tempered._compat import KERAS_MAJOR
>>> KERAS_MAJOR == 2 or (tempered_sigmoid is tf_tempered.tempered_sigmoid
...                      and TemperedSigmoid is tf_tempered.TemperedSigmoid)
True
"""

from tf_tempered._compat import KERAS_MAJOR, keras

__all__ = ["tempered_sigmoid", "TemperedSigmoid"]

KERAS2_MESSAGE = (
    "tf_tempered.keras3.{name} is the Keras 3 tempered sigmoid, but this process uses Keras "
    "{version} (TF_USE_LEGACY_KERAS=1 is set) and the two Kerases cannot be mixed. Fix: use "
    "tf_tempered.{name}, the same object for the active Keras (Keras 2 here); or unset "
    "TF_USE_LEGACY_KERAS (before TensorFlow is imported) and restart to use Keras 3, where "
    "tf_tempered.{name} is the Keras 3 one (tf_tempered.keras3 is no longer needed).")

if KERAS_MAJOR == 3:
    from tf_tempered.activations import tempered_sigmoid  # noqa: E402
    from tf_tempered.layers import TemperedSigmoid  # noqa: E402
else:
    def __getattr__(name):
        if name in __all__:
            raise ImportError(KERAS2_MESSAGE.format(name=name, version=keras.__version__))
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
