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
"""The tempered sigmoid as a layer of the active Keras, with optionally learnable (s, T, o).

    φ(x) = s / (1 + exp(-T·x)) - o

``TemperedSigmoid`` goes wherever an activation layer goes, or as
``keras.layers.Dense(..., activation=TemperedSigmoid(...))``. It is elementwise,
so each example's output depends on that example alone (DP-SGD's per-example
gradients rely on this). It is a layer of the Keras tf_tempered runs on (see
``tf_tempered._compat``): Keras 3 by default, Keras 2 with ``TF_USE_LEGACY_KERAS=1``,
registered with it under the package ``"tf_tempered"``.
"""

import numpy as np

from tf_tempered._compat import keras, tf  # noqa: F401  (tf: used by the doctests)
from tf_tempered.activations import _Ops  # pylint: disable=protected-access
from tf_tempered.activations import check_tempered_sigmoid_args
from tf_tempered.activations import inverse_softplus
from tf_tempered.activations import positive_floor
from tf_tempered.activations import register_serializable
from tf_tempered.activations import tempered_sigmoid

__all__ = ["TemperedSigmoid"]


@register_serializable(package="tf_tempered")
class TemperedSigmoid(keras.layers.Layer):
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

    Raises:
        ValueError: naming the argument, for a bad (s, T, o) or ``learnable``.

    The config stores the *initial* (s, T, o); trained values live in the weights
    and are restored by ``load_model`` / ``load_weights``. The properties
    ``scale``, ``inverse_temperature`` and ``offset`` give the current values.

    >>> import numpy as np
    >>> layer = TemperedSigmoid()  # (2, 2, 1): tanh
    >>> np.asarray(layer(tf.constant([[-1.0, 0.0, 1.0]])))
    array([[-0.7615942,  0.       ,  0.7615942]], dtype=float32)
    >>> layer = TemperedSigmoid(scale=1.5, inverse_temperature=3.0, offset=0.5,
    ...                         learnable=True)
    >>> _ = layer(tf.zeros((1, 2)))
    >>> [round(float(v), 6) for v in (layer.scale, layer.inverse_temperature, layer.offset)]
    [1.5, 3.0, 0.5]
    >>> len(layer.trainable_weights)
    3
    >>> TemperedSigmoid.from_config(layer.get_config()).learnable
    True
    """

    def __init__(self, scale=2.0, inverse_temperature=2.0, offset=1.0, learnable=False,
                 **kwargs):
        scale, inverse_temperature, offset = check_tempered_sigmoid_args(
            scale, inverse_temperature, offset, learnable=learnable, where="TemperedSigmoid")
        super().__init__(**kwargs)
        self.supports_masking = True
        self._initial = (scale, inverse_temperature, offset)
        self.learnable = bool(learnable)
        self._raw_scale = None
        self._raw_inverse_temperature = None
        self._offset_weight = None

    def build(self, input_shape):
        if self.learnable:
            scale, inverse_temperature, offset = self._initial
            self._raw_scale = self._scalar_weight("scale_raw", inverse_softplus(scale))
            self._raw_inverse_temperature = self._scalar_weight(
                "inverse_temperature_raw", inverse_softplus(inverse_temperature))
            self._offset_weight = self._scalar_weight("offset", offset)
        super().build(input_shape)

    def _scalar_weight(self, name, value):
        def initializer(shape, dtype=None, **unused_kwargs):
            # Rounded once, from float64, to the weight's dtype (Keras 3's Constant
            # would go through float32 and lose digits of a float64 weight).
            return _Ops.cast(np.full(shape, value, np.float64), dtype or _Ops.floatx())

        return self.add_weight(name=name, shape=(), trainable=True, initializer=initializer)

    @property
    def scale(self):
        """Current s: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_scale is None:
            return self._initial[0]
        return positive_floor(self._raw_scale)

    @property
    def inverse_temperature(self):
        """Current T: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_inverse_temperature is None:
            return self._initial[1]
        return positive_floor(self._raw_inverse_temperature)

    @property
    def offset(self):
        """Current o: a scalar tensor once a learnable layer is built, else a float."""
        if self._offset_weight is None:
            return self._initial[2]
        return _Ops.to_tensor(self._offset_weight)

    @property
    def offset_variable(self):
        """The trainable weight o of a built learnable layer (it enters φ as −o), else None."""
        return self._offset_weight

    def call(self, inputs):
        # Keras has already cast floating inputs to the compute dtype; the
        # activation casts the parameters to the dtype of `inputs`.
        return tempered_sigmoid(inputs, self.scale, self.inverse_temperature, self.offset)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        scale, inverse_temperature, offset = self._initial
        config.update(scale=scale, inverse_temperature=inverse_temperature, offset=offset,
                      learnable=self.learnable)
        return config


# Loading HDF5 (and SavedModel) looks a Dense's activation up by its bare class
# name rather than by the registered "tf_tempered>TemperedSigmoid"; keep a user's
# own "TemperedSigmoid" if they registered one first.
keras.utils.get_custom_objects().setdefault("TemperedSigmoid", TemperedSigmoid)
