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
"""The tempered sigmoid as a Keras 2 layer, with optionally learnable (s, T, o).

    φ(x) = s / (1 + exp(-T·x)) - o

``TemperedSigmoid`` goes wherever an activation layer goes, or as
``keras.layers.Dense(..., activation=TemperedSigmoid(...))``. It is elementwise,
so each example's output depends on that example alone (DP-SGD's per-example
gradients rely on this).
"""

from tf_tempered._compat import keras, tf
from tf_tempered._tempered_layer import TemperedSigmoidMixin
from tf_tempered.activations import smallest_normal
from tf_tempered.activations import tempered_sigmoid

__all__ = ["TemperedSigmoid"]


@keras.utils.register_keras_serializable(package="tf_tempered")
class TemperedSigmoid(TemperedSigmoidMixin, keras.layers.Layer):
    """Tempered sigmoid layer: φ(x) = s·σ(T·x) - o, elementwise.

    Args:
        scale: s > 0 (finite).
        inverse_temperature: T > 0 (finite).
        offset: o (finite).
        learnable: if True, (s, T, o) are three scalar trainable weights of this
            layer (the paper's layer-wise parameters), initialized at the values
            above. s and T are stored through a softplus, s = softplus(ρ_s)
            (floored at the dtype's smallest normal number against underflow),
            so no gradient step can make them zero or negative; o is stored as is.
            If False (the default) the layer has no weights.
        **kwargs: standard ``keras.layers.Layer`` arguments (``name``, ``dtype``...).

    The config stores the *initial* (s, T, o); trained values live in the weights
    and are restored by ``load_model`` / ``load_weights``. The properties
    ``scale``, ``inverse_temperature`` and ``offset`` give the current values.

    >>> layer = TemperedSigmoid()  # (2, 2, 1): tanh
    >>> layer(tf.constant([[-1.0, 0.0, 1.0]])).numpy()
    array([[-0.7615942,  0.       ,  0.7615942]], dtype=float32)
    >>> layer = TemperedSigmoid(scale=1.5, inverse_temperature=3.0, offset=0.5,
    ...                         learnable=True)
    >>> _ = layer(tf.zeros((1, 2)))
    >>> [round(float(v), 6) for v in (layer.scale, layer.inverse_temperature, layer.offset)]
    [1.5, 3.0, 0.5]
    >>> len(layer.trainable_weights)
    3
    """

    _where = "TemperedSigmoid"
    _constant_initializer = keras.initializers.Constant
    _activation = staticmethod(tempered_sigmoid)
    _to_tensor = staticmethod(tf.convert_to_tensor)

    @staticmethod
    def _positive(raw):
        value = tf.nn.softplus(raw)
        return tf.maximum(value, tf.constant(smallest_normal(value.dtype), value.dtype))


# Loading HDF5 (and SavedModel) looks a Dense's activation up by its bare class
# name rather than by the registered "tf_tempered>TemperedSigmoid"; keep a user's
# own "TemperedSigmoid" if they registered one first.
keras.utils.get_custom_objects().setdefault("TemperedSigmoid", TemperedSigmoid)
