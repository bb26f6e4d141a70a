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
"""The tempered sigmoid for Keras 3 (``import keras``), on any Keras 3 backend.

    φ(x) = s / (1 + exp(-T·x)) - o = s·σ(T·x) - o

Same arguments, validation, learnable option and config as
``tf_tempered.activations.tempered_sigmoid`` and ``tf_tempered.layers.TemperedSigmoid``
(which are for Keras 2 / ``tf.keras``), written with ``keras.ops`` and registered
with Keras 3 under the package ``"tf_tempered"``. DP-SGD with TensorFlow Privacy
still needs the Keras 2 versions. Importing this module runs ``tf_tempered``'s
Keras 2 bootstrap for ``tf.keras``; Keras 3's own ``keras`` package is unaffected.

>>> import keras
>>> keras.ops.convert_to_numpy(tempered_sigmoid(keras.ops.convert_to_tensor([-1.0, 0.0, 1.0])))
array([-0.7615942,  0.       ,  0.7615942], dtype=float32)
"""

import keras

from tf_tempered._tempered_layer import TemperedSigmoidMixin
from tf_tempered.activations import check_tempered_sigmoid_args
from tf_tempered.activations import smallest_normal

if not keras.__version__.startswith("3"):
    raise ImportError(
        f"tf_tempered.keras3 needs Keras 3, but `import keras` gives Keras {keras.__version__} "
        f"({keras.__file__}). Fix: `pip install 'keras>=3'`, or use the Keras 2 versions "
        "in tf_tempered.activations and tf_tempered.layers with tf.keras.")

__all__ = ["tempered_sigmoid", "TemperedSigmoid"]


@keras.saving.register_keras_serializable(package="tf_tempered")
def tempered_sigmoid(x, scale=2.0, inverse_temperature=2.0, offset=1.0):
    """Tempered sigmoid φ(x) = s·σ(T·x) - o, elementwise, with ``keras.ops``.

    As ``tf_tempered.activations.tempered_sigmoid``: the result has the dtype of
    ``x`` (integers become ``keras.config.floatx()``); parameters are Python
    numbers (validated) or tensors/variables; s = 2·o as Python numbers is
    computed as o·tanh(T·x / 2), so (2, 2, 1) is exactly ``keras.ops.tanh``.

    >>> y = tempered_sigmoid(keras.ops.convert_to_tensor([0.0, 2.0]), scale=1.0,
    ...                      inverse_temperature=1.0, offset=0.0)
    >>> keras.ops.convert_to_numpy(y)  # the logistic sigmoid
    array([0.5      , 0.8807971], dtype=float32)
    """
    scale, inverse_temperature, offset = check_tempered_sigmoid_args(
        scale, inverse_temperature, offset, allow_tensors=True,
        where="tf_tempered.keras3.tempered_sigmoid")
    x = keras.ops.convert_to_tensor(x)
    if not keras.backend.is_float_dtype(keras.backend.standardize_dtype(x.dtype)):
        x = keras.ops.cast(x, keras.config.floatx())
    dtype = keras.backend.standardize_dtype(x.dtype)
    if isinstance(scale, float) and isinstance(offset, float) and scale == 2.0 * offset:
        # s·σ(Tx) - o = o·(2σ(Tx) - 1) = o·tanh(Tx/2) when s = 2o.
        return (_as_dtype(offset, dtype)
                * keras.ops.tanh(_as_dtype(inverse_temperature / 2.0, dtype) * x))
    s = _as_dtype(scale, dtype)
    t = _as_dtype(inverse_temperature, dtype)
    o = _as_dtype(offset, dtype)
    return s * keras.ops.sigmoid(t * x) - o


def _as_dtype(value, dtype):
    # keras.ops.cast(1.7, "float64") would go through float32 and lose digits.
    if isinstance(value, float):
        return keras.ops.convert_to_tensor(value, dtype=dtype)
    return keras.ops.cast(value, dtype)


@keras.saving.register_keras_serializable(package="tf_tempered")
class TemperedSigmoid(TemperedSigmoidMixin, keras.layers.Layer):
    """Keras 3 tempered sigmoid layer: φ(x) = s·σ(T·x) - o, elementwise.

    Arguments and behaviour as ``tf_tempered.layers.TemperedSigmoid``:
    ``learnable=True`` makes (s, T, o) three scalar trainable weights, s and T
    through a softplus floored at the dtype's smallest normal number (always
    > 0), initialized at the given values; the config
    stores the initial values, the weights the trained ones.

    >>> layer = TemperedSigmoid(scale=1.5, inverse_temperature=3.0, offset=0.5,
    ...                         learnable=True)
    >>> _ = layer(keras.ops.zeros((1, 2)))
    >>> [round(float(v), 6) for v in (layer.scale, layer.inverse_temperature, layer.offset)]
    [1.5, 3.0, 0.5]
    """

    _where = "tf_tempered.keras3.TemperedSigmoid"
    _constant_initializer = keras.initializers.Constant
    _activation = staticmethod(tempered_sigmoid)
    _to_tensor = staticmethod(keras.ops.convert_to_tensor)

    @staticmethod
    def _positive(raw):
        value = keras.ops.softplus(raw)
        dtype = keras.backend.standardize_dtype(value.dtype)
        return keras.ops.maximum(value,
                                 keras.ops.convert_to_tensor(smallest_normal(dtype), dtype))
