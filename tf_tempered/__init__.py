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
Importing this package first binds ``tf.keras`` to Keras 2 (tf-keras) and, where it
is installed (Python <= 3.11), makes TensorFlow Privacy importable on current
TensorFlow (see ``tf_tempered._compat``). ``tf_tempered.DPKerasSGDOptimizer`` (and
Adam, Adagrad) take TF Privacy's arguments and work on every supported Python.
"""

from tf_tempered import _compat  # noqa: F401  (must run before anything touches tf.keras)
from tf_tempered.version import __version__

# Importing these registers the activation and layer with Keras 2, so saved models
# reload without custom_objects after a plain `import tf_tempered`.
from tf_tempered import activations, layers  # noqa: E402
from tf_tempered import callbacks, data, models, privacy  # noqa: E402
from tf_tempered.callbacks import ActivationNormMonitor, PrivacyBudget  # noqa: E402
from tf_tempered.activations import tempered_sigmoid  # noqa: E402
from tf_tempered.layers import TemperedSigmoid  # noqa: E402
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
]
