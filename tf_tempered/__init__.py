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
"""tf_tempered: tempered sigmoid activations for differentially private Keras training.

The tempered sigmoid of Papernot et al. (AAAI 2021) is

    φ(x) = s / (1 + exp(-T·x)) - o

with scale ``s``, inverse temperature ``T`` and offset ``o``; (s, T, o) = (2, 2, 1) is tanh.
tf_tempered runs on the Keras TensorFlow binds to ``tf.keras``, without changing it:
Keras 3 (``import keras``) by default, Keras 2 (tf-keras) when ``TF_USE_LEGACY_KERAS=1``
is set before TensorFlow is imported (see ``tf_tempered._compat``). Its public objects
(``TemperedSigmoid``, ``WeightStandardizedConv2D``, ``tempered_sigmoid``, ``mnist_cnn``,
``swap_activations``, the callbacks, ``make_private``) are those of that Keras; no separate
module is needed (the former ``tf_tempered.keras3`` alias is gone).
``tf_tempered.DPKerasSGDOptimizer`` (and Adam, Adagrad) take TF Privacy's arguments and work
on both Kerases; TensorFlow Privacy itself, where installed (Python <= 3.11), works with
Keras 2 only.
"""

from tf_tempered import _compat  # noqa: F401  (must run before anything touches tf.keras)
from tf_tempered.version import __version__

# Importing these registers the activation and layer with the active Keras, so saved
# models reload without custom_objects after a plain `import tf_tempered`.
from tf_tempered import activations, layers  # noqa: E402
from tf_tempered import callbacks, data, models, privacy  # noqa: E402
from tf_tempered.callbacks import ActivationNormMonitor, PrivacyBudget  # noqa: E402
from tf_tempered.ema import ExponentialMovingAverage  # noqa: E402
from tf_tempered.activations import tempered_sigmoid  # noqa: E402
from tf_tempered.layers import TemperedSigmoid, WeightStandardizedConv2D  # noqa: E402
from tf_tempered.models import cifar10_cnn, mnist_cnn, resolve_activation  # noqa: E402
from tf_tempered.privacy import (DPKerasAdagradOptimizer, DPKerasAdamOptimizer,  # noqa: E402
                                 DPKerasSGDOptimizer, make_private)
from tf_tempered.swap import swap_activations  # noqa: E402

__all__ = [
    "__version__",
    "ActivationNormMonitor",
    "DPKerasAdagradOptimizer",
    "DPKerasAdamOptimizer",
    "DPKerasSGDOptimizer",
    "ExponentialMovingAverage",
    "PrivacyBudget",
    "activations",
    "callbacks",
    "cifar10_cnn",
    "data",
    "layers",
    "make_private",
    "mnist_cnn",
    "models",
    "privacy",
    "resolve_activation",
    "swap_activations",
    "tempered_sigmoid",
    "TemperedSigmoid",
    "WeightStandardizedConv2D",
]
