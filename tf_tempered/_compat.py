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
"""The one place that binds Keras 2 (tf-keras) and imports TensorFlow Privacy.

TensorFlow Privacy is optional: its last release (0.9.0) declares Python < 3.12, and
setup.cfg installs it only there. Where it is not installed, ``tensorflow_privacy``
here is None, and code that needs it calls :func:`require_tensorflow_privacy`, which
raises an ImportError saying how to get it or to use tf_tempered's own
``tf_tempered.privacy.DPKerasSGDOptimizer`` (and Adam, Adagrad) instead.

TensorFlow Privacy 0.9.0 is written for Keras 2 (``tf.keras`` = tf-keras), and its
top-level ``__init__`` imports the Estimator API that TensorFlow 2.16+ removed.
Two switches make it work on current TensorFlow, and both must be set before the
modules that read them are loaded:

* ``TF_USE_LEGACY_KERAS=1`` before ``tf.keras`` is first touched (TensorFlow
    binds ``tf.keras`` lazily, on first attribute access);
* ``sys.skip_tf_privacy_import = True`` before ``import tensorflow_privacy``.

:func:`bootstrap` sets both, then re-exports the working public names of
TensorFlow Privacy on its top-level module (optimizers, ``DPModel``,
``DPSequential``, queries, analysis), so ``tensorflow_privacy.DPKerasSGDOptimizer``
works as its tutorials show (when it is installed). Every other module of tf_tempered imports ``tf``
and ``keras`` from here and never from TensorFlow directly.
"""

import importlib
import importlib.util
import os
import sys

__all__ = ["bootstrap", "tf", "keras", "tensorflow_privacy", "require_tensorflow_privacy",
           "KERAS3_BOUND_MESSAGE", "TF_PRIVACY_MISSING_MESSAGE"]

TF_PRIVACY_MISSING_MESSAGE = (
        "{feature} needs TensorFlow Privacy (the tensorflow-privacy package), which is not "
        "installed in this Python ({python}). Fix: on Python <= 3.11, "
        "`pip install tensorflow-privacy==0.9.*` (its last release, 0.9.0, does not install "
        "on Python 3.12+); or use tf_tempered's own DP optimizers, which take the same "
        "arguments and work on every supported Python: "
        "`from tf_tempered.privacy import DPKerasSGDOptimizer` (or DPKerasAdamOptimizer, "
        "DPKerasAdagradOptimizer) with tf_tempered.make_private(model).")

KERAS3_BOUND_MESSAGE = (
        "tf_tempered needs Keras 2 (the tf-keras package) behind `tf.keras`, because "
        "TensorFlow Privacy is written for it, but `tf.keras` is already bound to Keras 3 "
        "({bound}) in this process. Fix: set the environment variable "
        "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (for example "
        "`import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'` as the first line of your "
        "program or notebook, or `export TF_USE_LEGACY_KERAS=1` in the shell), or simply "
        "`import tf_tempered` before anything touches `tf.keras`; then restart the "
        "process (or the notebook kernel). Make sure tf-keras is installed "
        "(`pip install tf-keras`). To use the TemperedSigmoid activation from Keras 3 "
        "code without TensorFlow Privacy, import `tf_tempered.keras3` in a process "
        "where tf.keras is not yet bound."
)

# Public names of tensorflow_privacy's own __init__ that still import on TF 2.16+
# (everything but `v1` and the Estimator-based DNNClassifier).
_TFP_EXPORTS = {
        "tensorflow_privacy.privacy.analysis.compute_dp_sgd_privacy_lib": (
            "compute_dp_sgd_privacy", "compute_dp_sgd_privacy_statement"),
        "tensorflow_privacy.privacy.dp_query.gaussian_query": ("GaussianSumQuery",),
        "tensorflow_privacy.privacy.dp_query.dp_query": ("DPQuery", "SumAggregationDPQuery"),
        "tensorflow_privacy.privacy.dp_query.normalized_query": ("NormalizedQuery",),
        "tensorflow_privacy.privacy.dp_query.nested_query": ("NestedQuery",),
        "tensorflow_privacy.privacy.dp_query.no_privacy_query": (
            "NoPrivacyAverageQuery", "NoPrivacySumQuery"),
        "tensorflow_privacy.privacy.keras_models.dp_keras_model": (
            "DPModel", "DPSequential", "make_dp_model_class"),
        "tensorflow_privacy.privacy.optimizers.dp_optimizer_keras": (
            "GenericDPAdagradOptimizer", "GenericDPAdamOptimizer", "GenericDPSGDOptimizer",
            "DPKerasAdagradOptimizer", "DPKerasAdamOptimizer", "DPKerasSGDOptimizer",
            "DPFTRLTreeAggregationOptimizer", "make_gaussian_query_optimizer_class",
            "make_keras_generic_optimizer_class", "make_keras_optimizer_class"),
        "tensorflow_privacy.privacy.optimizers.dp_optimizer_keras_vectorized": (
            "VectorizedDPKerasAdagradOptimizer", "VectorizedDPKerasAdamOptimizer",
            "VectorizedDPKerasSGDOptimizer", "make_vectorized_keras_optimizer_class"),
}


def _bound_keras_name(tf_module):
    """Name of the module `tf.keras` is bound to, or None while still unbound."""
    loader = tf_module.__dict__.get("keras")
    if loader is None:
        return None
    if type(loader).__name__ == "KerasLazyLoader" and not getattr(
        loader, "_tfll_initialized", False):
        return None
    return getattr(loader, "__name__", repr(loader))


def bootstrap():
    """Binds tf.keras to tf-keras and imports TensorFlow Privacy; returns (tf, keras, tfp).

    ``tfp`` is None when TensorFlow Privacy is not installed. Idempotent. Raises
    ImportError, saying how to fix it, when tf.keras is already bound to Keras 3 in
    this process.
    """
    if "tensorflow" in sys.modules:
        bound = _bound_keras_name(sys.modules["tensorflow"])
        if bound is not None and not bound.startswith("tf_keras"):
            raise ImportError(KERAS3_BOUND_MESSAGE.format(bound=bound))
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    sys.skip_tf_privacy_import = True

    import tensorflow as tf_  # pylint: disable=g-import-not-at-top
    try:
        import tf_keras as keras_  # pylint: disable=g-import-not-at-top
    except ImportError as e:  # pragma: no cover - install problem
        raise ImportError("tf_tempered needs the tf-keras package (Keras 2): "
                          "`pip install tf-keras` matching your TensorFlow version.") from e
    bound = getattr(tf_.keras, "__name__", "")
    if not bound.startswith("tf_keras"):
        raise ImportError(KERAS3_BOUND_MESSAGE.format(bound=bound))

    del keras_  # imported above only to fail early with a clear message
    if importlib.util.find_spec("tensorflow_privacy") is None:
        return tf_, tf_.keras, None
    import tensorflow_privacy as tfp_  # pylint: disable=g-import-not-at-top
    for module_name, names in _TFP_EXPORTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(tfp_, name):
                setattr(tfp_, name, getattr(module, name))
    return tf_, tf_.keras, tfp_


def require_tensorflow_privacy(feature="This"):
    """The tensorflow_privacy module; ImportError with the fix when it is not installed.

    >>> try:
    ...     tfp = require_tensorflow_privacy("The comparison")
    ... except ImportError as e:  # not installed (Python 3.12+): the message has the fix
    ...     tfp = None
    ...     assert "pip install tensorflow-privacy" in str(e) and "DPKerasSGDOptimizer" in str(e)
    >>> tfp is tensorflow_privacy
    True
    """
    if tensorflow_privacy is None:
        raise ImportError(TF_PRIVACY_MISSING_MESSAGE.format(
            feature=feature, python=".".join(map(str, sys.version_info[:3]))))
    return tensorflow_privacy


tf, keras, tensorflow_privacy = bootstrap()
