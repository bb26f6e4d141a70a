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
"""The one place that decides which Keras tf_tempered uses, and imports TensorFlow Privacy.

No side effect on the user's Keras: tf_tempered uses the Keras TensorFlow itself binds
to ``tf.keras``. That is Keras 3 (the ``keras`` package, TensorFlow backend) by default,
and Keras 2 (tf-keras) when the user selected it the standard way, with the environment
variable ``TF_USE_LEGACY_KERAS=1`` set before TensorFlow is imported (TensorFlow's own
rule, see :func:`legacy_keras_requested`). Every other module of tf_tempered imports
``tf`` and ``keras`` from here, never from TensorFlow or Keras directly, and
:data:`KERAS_MAJOR` (2 or 3) is the one switch the thin Keras adapters read.

TensorFlow Privacy is optional and Keras 2 only: its last release (0.9.0) declares
Python < 3.12 (setup.cfg installs it only there) and its optimizers subclass Keras 2's.
With Keras 2 selected and the package installed, :func:`bootstrap` makes it import on
current TensorFlow (``sys.skip_tf_privacy_import = True`` skips its top-level
``__init__``, which imports the Estimator API that TensorFlow 2.16+ removed) and
re-exports its working public names on its top-level module, so
``tensorflow_privacy.DPKerasSGDOptimizer`` works as its tutorials show. Otherwise
``tensorflow_privacy`` here is None and :func:`require_tensorflow_privacy` raises an
ImportError with the fix (select Keras 2, install it, or use tf_tempered's own
``tf_tempered.privacy.DPKerasSGDOptimizer``, Adam, Adagrad, which work on both Kerases).
"""

import importlib
import importlib.util
import os
import sys

__all__ = ["bootstrap", "tf", "keras", "tensorflow_privacy", "require_tensorflow_privacy",
           "KERAS_MAJOR", "check_same_keras", "legacy_keras_requested",
           "other_keras_name",
           "KERAS_MISMATCH_MESSAGE", "TF_PRIVACY_NEEDS_KERAS2_MESSAGE",
           "KERAS3_BOUND_MESSAGE", "TF_PRIVACY_MISSING_MESSAGE"]

TF_PRIVACY_MISSING_MESSAGE = (
        "{feature} needs TensorFlow Privacy (the tensorflow-privacy package), which is not "
        "installed in this Python ({python}). Fix: on Python <= 3.11, "
        "`pip install tensorflow-privacy==0.9.*` (its last release, 0.9.0, does not install "
        "on Python 3.12+); or use tf_tempered's own DP optimizers, which take the same "
        "arguments and work on every supported Python: "
        "`from tf_tempered.privacy import DPKerasSGDOptimizer` (or DPKerasAdamOptimizer, "
        "DPKerasAdagradOptimizer) with tf_tempered.make_private(model).")

TF_PRIVACY_NEEDS_KERAS2_MESSAGE = (
        "{feature} needs TensorFlow Privacy, which works with Keras 2 only, and this process "
        "uses Keras 3. Fix: set the environment variable TF_USE_LEGACY_KERAS=1 before "
        "TensorFlow is imported (e.g. `export TF_USE_LEGACY_KERAS=1`, or "
        "`os.environ['TF_USE_LEGACY_KERAS'] = '1'` as the first line of the program) and "
        "restart; or use tf_tempered's own DP optimizers, which work on Keras 3: "
        "`from tf_tempered.privacy import DPKerasSGDOptimizer` with tf_tempered.make_private(model).")

KERAS_MISMATCH_MESSAGE = (
        "TF_USE_LEGACY_KERAS is not set, so tf_tempered uses Keras 3, but `tf.keras` is "
        "already bound to Keras 2 ({bound}) in this process. Fix: set "
        "TF_USE_LEGACY_KERAS=1 before TensorFlow is imported to use Keras 2 throughout, "
        "or do not import tf_keras, and restart the process.")

KERAS3_BOUND_MESSAGE = (
        "TF_USE_LEGACY_KERAS=1 selects Keras 2 (tf-keras), but `tf.keras` was already "
        "bound to Keras 3 ({bound}) in this process, before the variable was set. Fix: "
        "set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported (`export "
        "TF_USE_LEGACY_KERAS=1` in the shell, or `import os; "
        "os.environ['TF_USE_LEGACY_KERAS'] = '1'` as the first line of the program or "
        "notebook) and restart the process (or the notebook kernel); or unset it to use "
        "Keras 3. Keras 2 needs tf-keras (`pip install tf-keras`)."
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


def _tf_privacy_installed():
    try:
        return importlib.util.find_spec("tensorflow_privacy") is not None
    except ValueError:  # sys.modules["tensorflow_privacy"] = None: treated as absent
        return False


def legacy_keras_requested(environ=None):
    """True if the user selected Keras 2 the standard way (TensorFlow's own rule).

    TensorFlow binds ``tf.keras`` to tf-keras when ``TF_USE_LEGACY_KERAS`` is
    ``1``/``true``/``True`` at the time ``tf.keras`` is first touched.
    """
    environ = os.environ if environ is None else environ
    return environ.get("TF_USE_LEGACY_KERAS", None) in ("1", "true", "True")


def bootstrap():
    """Returns (tf, keras, tfp) for the Keras the user selected; no side effect on it.

    Keras 3 (``import keras``, TensorFlow backend) unless ``TF_USE_LEGACY_KERAS=1``
    was set before TensorFlow bound ``tf.keras``; then Keras 2 (tf-keras), and
    TensorFlow Privacy made importable where it is installed. ``tfp`` is None on
    Keras 3 (TF Privacy works with Keras 2 only) and where it is not installed.
    """
    import tensorflow as tf_  # pylint: disable=g-import-not-at-top
    if not legacy_keras_requested():
        bound = _bound_keras_name(tf_)
        if bound is not None and bound.startswith("tf_keras"):
            raise ImportError(KERAS_MISMATCH_MESSAGE.format(bound=bound))
        import keras as keras_  # pylint: disable=g-import-not-at-top
        if not keras_.__version__.startswith("3."):
            raise ImportError(f"tf_tempered needs Keras 3 (`pip install 'keras>=3'`) or, with "
                              f"TF_USE_LEGACY_KERAS=1, Keras 2; `import keras` gives "
                              f"{keras_.__version__}.")
        return tf_, keras_, None
    sys.skip_tf_privacy_import = True
    try:
        import tf_keras as keras_  # pylint: disable=g-import-not-at-top
    except ImportError as e:  # pragma: no cover - install problem
        raise ImportError("TF_USE_LEGACY_KERAS=1 selects Keras 2, which needs the tf-keras "
                          "package: `pip install tf-keras` matching your TensorFlow version.") from e
    bound = getattr(tf_.keras, "__name__", "")
    if not bound.startswith("tf_keras"):
        raise ImportError(KERAS3_BOUND_MESSAGE.format(bound=bound))
    if not _tf_privacy_installed():
        return tf_, keras_, None
    import tensorflow_privacy as tfp_  # pylint: disable=g-import-not-at-top
    for module_name, names in _TFP_EXPORTS.items():
        module = importlib.import_module(module_name)
        for name in names:
            if not hasattr(tfp_, name):
                setattr(tfp_, name, getattr(module, name))
    return tf_, keras_, tfp_


def require_tensorflow_privacy(feature="This"):
    """The tensorflow_privacy module; ImportError with the fix when it is not installed.

    >>> try:
    ...     tfp = require_tensorflow_privacy("The comparison")
    ... except ImportError as e:  # Keras 3, or not installed (Python 3.12+): the fix is said
    ...     tfp = None
    ...     assert "TF_USE_LEGACY_KERAS=1" in str(e) or "pip install tensorflow-privacy" in str(e)
    ...     assert "DPKerasSGDOptimizer" in str(e)
    >>> tfp is tensorflow_privacy
    True
    """
    if tensorflow_privacy is None and KERAS_MAJOR == 3 and _tf_privacy_installed():
        raise ImportError(TF_PRIVACY_NEEDS_KERAS2_MESSAGE.format(feature=feature))
    if tensorflow_privacy is None:
        raise ImportError(TF_PRIVACY_MISSING_MESSAGE.format(
            feature=feature, python=".".join(map(str, sys.version_info[:3]))))
    return tensorflow_privacy


tf, keras, tensorflow_privacy = bootstrap()

#: 2 (tf-keras, selected with TF_USE_LEGACY_KERAS=1) or 3 (``import keras``, the default).
KERAS_MAJOR = int(keras.__version__.split(".")[0])


def other_keras_name():
    """The package name of the Keras tf_tempered does NOT use in this process."""
    return "keras" if KERAS_MAJOR == 2 else "tf_keras"


def check_same_keras(obj, argument):
    """Raises TypeError when `obj` comes from the other Keras than the active one.

    A Keras 3 model with a Keras 2 optimizer (or the reverse) cannot train; the
    message says which to change.
    """
    # The class's own module, or its nearest Keras base's (a user's subclass of keras.Model).
    roots = [c.__module__.split(".")[0] for c in type(obj).__mro__]
    keras_roots = [r for r in roots if r in ("keras", "tf_keras")]
    if not keras_roots or keras_roots[0] != other_keras_name():
        return
    module = keras_roots[0]
    active = ("Keras 3 (`import keras`; TF_USE_LEGACY_KERAS is not set)" if KERAS_MAJOR == 3
              else "Keras 2 (tf-keras; TF_USE_LEGACY_KERAS=1)")
    theirs = "Keras 2 (tf_keras / tf.keras with TF_USE_LEGACY_KERAS=1)" if module == "tf_keras" \
        else "Keras 3 (the `keras` package)"
    raise TypeError(
        f"{argument} is a {type(obj).__name__} from {theirs}, but tf_tempered runs on {active} "
        f"in this process: the two Keras versions cannot be mixed. Fix: build the model, "
        f"layers and optimizer from one Keras: "
        + ("`import keras` (not tf_keras), or set TF_USE_LEGACY_KERAS=1 before TensorFlow is "
           "imported to use Keras 2 throughout" if KERAS_MAJOR == 3 else
           "`tf.keras` / `import tf_keras` (not the keras package), or unset TF_USE_LEGACY_KERAS "
           "to use Keras 3 throughout") + " (then restart the process).")
