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
"""The framework-independent body of the TemperedSigmoid layers (Keras 2 and Keras 3).

`tf_tempered.layers.TemperedSigmoid` (tf.keras) and `tf_tempered.keras3.TemperedSigmoid`
mix this in before their framework's Layer and supply only what differs between the
two: the activation function, softplus and tensor conversion, and the Constant
initializer class.
"""

from tf_tempered.activations import check_tempered_sigmoid_args, inverse_softplus

__all__ = ["TemperedSigmoidMixin"]


class TemperedSigmoidMixin:
    """φ(x) = s·σ(T·x) - o with fixed or learnable (s, T, o); see the subclasses' docs."""

    # Supplied by each subclass.
    _where = "TemperedSigmoid"
    _constant_initializer = None

    @staticmethod
    def _activation(inputs, scale, inverse_temperature, offset):
        raise NotImplementedError

    @staticmethod
    def _positive(raw):
        """softplus(raw), floored at the dtype's smallest normal number (never 0)."""
        raise NotImplementedError

    @staticmethod
    def _to_tensor(value):
        raise NotImplementedError

    def __init__(self, scale=2.0, inverse_temperature=2.0, offset=1.0, learnable=False,
                 **kwargs):
        scale, inverse_temperature, offset = check_tempered_sigmoid_args(
            scale, inverse_temperature, offset, learnable=learnable, where=self._where)
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
        return self.add_weight(name=name, shape=(), trainable=True,
                               initializer=self._constant_initializer(value))

    @property
    def scale(self):
        """Current s: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_scale is None:
            return self._initial[0]
        return self._positive(self._raw_scale)

    @property
    def inverse_temperature(self):
        """Current T: a scalar tensor once a learnable layer is built, else a float."""
        if self._raw_inverse_temperature is None:
            return self._initial[1]
        return self._positive(self._raw_inverse_temperature)

    @property
    def offset(self):
        """Current o: a scalar tensor once a learnable layer is built, else a float."""
        if self._offset_weight is None:
            return self._initial[2]
        return self._to_tensor(self._offset_weight)

    def call(self, inputs):
        # Keras has already cast floating inputs to the compute dtype; the
        # activation casts the parameters to the dtype of `inputs`.
        return self._activation(inputs, self.scale, self.inverse_temperature, self.offset)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        scale, inverse_temperature, offset = self._initial
        config.update(scale=scale, inverse_temperature=inverse_temperature, offset=offset,
                      learnable=self.learnable)
        return config
