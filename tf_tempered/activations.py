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
"""The tempered sigmoid activation (Papernot et al., AAAI 2021), for the active Keras.

    φ(x) = s / (1 + exp(-T·x)) - o = s·σ(T·x) - o

with scale ``s > 0``, inverse temperature ``T > 0`` and offset ``o``.
(s, T, o) = (2, 2, 1) is tanh. One implementation serves both Kerases (see
``tf_tempered._compat``): on Keras 3 (the default) it is written with ``keras.ops``
and registered with ``keras.saving.register_keras_serializable``; on Keras 2
(``TF_USE_LEGACY_KERAS=1``) with TensorFlow ops and
``keras.utils.register_keras_serializable``. Importing this module registers the
function as ``"tf_tempered>tempered_sigmoid"`` and as the plain string
``"tempered_sigmoid"``, so ``keras.layers.Dense(4, activation="tempered_sigmoid")``
works and models using it save to ``.keras`` and load without ``custom_objects``.
For HDF5 (``.h5``) files use ``activation=tf_tempered.layers.TemperedSigmoid()``
instead: Keras cannot reload a custom *function* activation from HDF5.
"""

import math
import numbers

import numpy as np

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.keras_bridge import register_activation_name

__all__ = ["tempered_sigmoid", "check_tempered_sigmoid_args", "inverse_softplus",
           "smallest_normal", "register_serializable"]

#: The decorator registering a class or function with the active Keras under the
#: package "tf_tempered" (``keras.saving`` on Keras 3, ``keras.utils`` on Keras 2).
register_serializable = (keras.saving.register_keras_serializable if KERAS_MAJOR == 3
                         else keras.utils.register_keras_serializable)

_ARG_HINTS = {
    "scale": "a finite number > 0",
    "inverse_temperature": "a finite number > 0",
    "offset": "a finite number",
}
_DEFAULTS = {"scale": 2.0, "inverse_temperature": 2.0, "offset": 1.0}


def _is_python_number(value):
    # bool is a numbers.Real subclass, but scale=True is a bug, not a number.
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_tempered_sigmoid_args(scale, inverse_temperature, offset, learnable=False,
                                allow_tensors=False, where="tempered_sigmoid"):
    """Validates (s, T, o) and ``learnable``; returns (s, T, o), numbers as floats.

    The one validation of the function and the layer, on either Keras.
    Tensors and variables are passed through unchecked when ``allow_tensors``
    (their values are only known at run time). Raises ValueError naming the
    argument, the value received and the fix.

    >>> check_tempered_sigmoid_args(2, 2, 1)
    (2.0, 2.0, 1.0)
    >>> check_tempered_sigmoid_args(2.0, -1.0, 1.0)
    Traceback (most recent call last):
    ...
    ValueError: tempered_sigmoid: `inverse_temperature` must be a finite number > 0, got -1.0. ...
    """
    checked = []
    for name, value in (("scale", scale), ("inverse_temperature", inverse_temperature),
                        ("offset", offset)):
        if _is_python_number(value):
            try:
                value = float(value)
            except OverflowError:  # an int beyond float range, e.g. 10**400
                value = math.inf if value > 0 else -math.inf
            if math.isfinite(value) and (name == "offset" or value > 0.0):
                checked.append(value)
                continue
            got = repr(value)
        elif allow_tensors and value is not None and not isinstance(
                value, (bool, np.bool_, str, bytes)):
            checked.append(value)
            continue
        else:
            got = f"{value!r} ({type(value).__name__})"
        raise ValueError(
            f"{where}: `{name}` must be {_ARG_HINTS[name]}, got {got}. Fix: pass {name} as "
            f"{_ARG_HINTS[name]}, e.g. {name}={_DEFAULTS[name]} "
            "(scale=2, inverse_temperature=2, offset=1 is tanh).")
    if not isinstance(learnable, (bool, np.bool_)):
        raise ValueError(
            f"{where}: `learnable` must be a bool, got {learnable!r} "
            f"({type(learnable).__name__}). Fix: pass learnable=True to train (s, T, o) "
            "or learnable=False to keep them fixed.")
    return tuple(checked)


def inverse_softplus(y):
    """The ``x`` with ``softplus(x) = log(1 + exp(x)) = y``, for ``y > 0`` (float64).

    Written as ``y + log(-expm1(-y))``, which neither overflows for large ``y``
    (where it tends to ``y``) nor loses precision for small ``y`` (``≈ log(y)``).

    >>> round(inverse_softplus(math.log(2.0)), 12)
    0.0
    >>> inverse_softplus(1e4)
    10000.0
    """
    y = float(y)
    if not y > 0.0:
        raise ValueError(f"inverse_softplus: `y` must be > 0, got {y!r}.")
    return float(y + np.log(-np.expm1(-y)))


# Smallest positive normal number of each floating dtype (bfloat16 has float32's
# exponent range).
_SMALLEST_NORMAL = {"float16": 2.0 ** -14, "bfloat16": 2.0 ** -126, "float32": 2.0 ** -126,
                    "float64": 2.0 ** -1022}


def smallest_normal(dtype):
    """Smallest positive normal number of a floating dtype (a name or a dtype object).

    The learnable layers keep s and T at or above it, so that a softplus that
    underflows after a huge gradient step still leaves them strictly positive.

    >>> smallest_normal("float16")
    6.103515625e-05
    >>> smallest_normal(tf.float32) == float(np.finfo(np.float32).tiny)
    True
    """
    name = getattr(dtype, "name", dtype)
    if name not in _SMALLEST_NORMAL:
        raise ValueError(f"smallest_normal: `dtype` must be one of {sorted(_SMALLEST_NORMAL)}, "
                         f"got {dtype!r}.")
    return _SMALLEST_NORMAL[name]


class _Ops:
    """The few tensor operations the tempered sigmoid needs, for the active Keras.

    Keras 3: ``keras.ops`` (any backend; symbolic KerasTensors pass through);
    Keras 2: TensorFlow. The math in :func:`tempered_sigmoid` and in the layer is
    written once on top of these.
    """

    if KERAS_MAJOR == 3:
        sigmoid = staticmethod(keras.ops.sigmoid)
        tanh = staticmethod(keras.ops.tanh)
        softplus = staticmethod(keras.ops.softplus)
        maximum = staticmethod(keras.ops.maximum)

        @staticmethod
        def dtype_name(x):
            return keras.backend.standardize_dtype(x.dtype)

        @staticmethod
        def to_tensor(x):
            return x if keras.backend.is_keras_tensor(x) else keras.ops.convert_to_tensor(x)

        @staticmethod
        def is_floating(x):
            return keras.backend.is_float_dtype(_Ops.dtype_name(x))

        @staticmethod
        def constant(value, dtype):
            return keras.ops.convert_to_tensor(value, dtype=dtype)

        cast = staticmethod(keras.ops.cast)
        floatx = staticmethod(keras.config.floatx)
    else:
        sigmoid = staticmethod(tf.sigmoid)
        tanh = staticmethod(tf.tanh)
        softplus = staticmethod(tf.nn.softplus)
        maximum = staticmethod(tf.maximum)

        @staticmethod
        def dtype_name(x):
            return x.dtype.name

        to_tensor = staticmethod(tf.convert_to_tensor)

        @staticmethod
        def is_floating(x):
            return x.dtype.is_floating

        @staticmethod
        def constant(value, dtype):
            return tf.constant(value, dtype=dtype)

        cast = staticmethod(tf.cast)
        floatx = staticmethod(keras.backend.floatx)


def positive_floor(raw):
    """softplus(raw), floored at its dtype's smallest normal number: always > 0.

    The learnable layer stores s and T this way, so that no gradient step can make
    them zero or negative, even where the softplus underflows.

    >>> float(positive_floor(tf.constant(-200.0))) == smallest_normal("float32")
    True
    """
    value = _Ops.softplus(raw)
    dtype = _Ops.dtype_name(value)
    return _Ops.maximum(value, _Ops.constant(smallest_normal(dtype), dtype))


@register_serializable(package="tf_tempered")
def tempered_sigmoid(x, scale=2.0, inverse_temperature=2.0, offset=1.0):
    """Tempered sigmoid φ(x) = s·σ(T·x) - o = s / (1 + exp(-T·x)) - o, elementwise.

    Args:
        x: floating tensor (integers are cast to ``keras.backend.floatx()``).
            The result has the dtype of ``x``.
        scale: s > 0. Python number, or a tensor/variable (e.g. a trained weight).
        inverse_temperature: T > 0. Python number or tensor.
        offset: o. Python number or tensor.

    When s = 2·o are Python numbers it is computed as o·tanh(T·x / 2), the same
    function without the cancellation of s·σ(T·x) - o near 0; so the default
    (2, 2, 1) is exactly ``tanh``.

    >>> import numpy as np
    >>> np.asarray(tempered_sigmoid(tf.constant([-1.0, 0.0, 1.0])))
    array([-0.7615942,  0.       ,  0.7615942], dtype=float32)
    >>> np.asarray(tempered_sigmoid(tf.constant([0.0, 2.0]), scale=1.0,
    ...                             inverse_temperature=1.0, offset=0.0))  # logistic sigmoid
    array([0.5      , 0.8807971], dtype=float32)
    """
    scale, inverse_temperature, offset = check_tempered_sigmoid_args(
        scale, inverse_temperature, offset, allow_tensors=True)
    x = _Ops.to_tensor(x)
    if not _Ops.is_floating(x):
        x = _Ops.cast(x, _Ops.floatx())
    dtype = _Ops.dtype_name(x)
    if isinstance(scale, float) and isinstance(offset, float) and scale == 2.0 * offset:
        # s·σ(Tx) - o = o·(2σ(Tx) - 1) = o·tanh(Tx/2) when s = 2o.
        return _as_dtype(offset, dtype) * _Ops.tanh(_as_dtype(inverse_temperature / 2.0, dtype) * x)
    s = _as_dtype(scale, dtype)
    t = _as_dtype(inverse_temperature, dtype)
    o = _as_dtype(offset, dtype)
    return s * _Ops.sigmoid(t * x) - o


def _as_dtype(value, dtype):
    # A cast of the Python float 1.7 to float64 would go through float32 and lose digits.
    if isinstance(value, float):
        return _Ops.constant(value, dtype)
    return _Ops.cast(value, dtype)


# The string "tempered_sigmoid" names this activation in `activation=` arguments.
register_activation_name("tempered_sigmoid", tempered_sigmoid)
