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
"""The models the experiment scripts train: a TrainConfig's model for a dataset."""

from tf_tempered._compat import keras
from tf_tempered.experiments import feature_norm
from tf_tempered.experiments.config import ConfigError
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.models import cifar10_cnn, mnist_cnn, resolve_activation
from tf_tempered.scatternet import scatternet_cnn, scatternet_linear

__all__ = ["digits_cnn", "build_model", "first_activation_layer"]


def digits_cnn(activation="tempered_sigmoid", *, input_shape=(8, 8, 1), num_classes=10,
               name="digits_cnn"):
    """A small CNN for scikit-learn's 8×8 digits, where the paper's 8×8-kernel CNN does not fit.

    Conv2D 16, 3×3 + act → Flatten → Dense 32 + act → Dense num_classes (logits);
    ``activation`` takes any form :func:`tf_tempered.models.resolve_activation` accepts.

    >>> digits_cnn("relu").count_params()
    18954
    """
    make_activation = resolve_activation(activation)
    inputs = keras.Input(shape=tuple(input_shape), name="image")
    x = keras.layers.Conv2D(16, 3, name="conv1")(inputs)
    x = make_activation()(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(32, name="dense1")(x)
    x = make_activation()(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def build_model(config, dataset, feature_stats=None):
    """The paper's CNN for ``dataset`` (digits: :func:`digits_cnn`) with config's activation.

    ``features="scatternet"``: :func:`tf_tempered.scatternet.scatternet_cnn` instead
    (``head="linear"``: :func:`~tf_tempered.scatternet.scatternet_linear`), its input
    normalized as ``feature_norm`` says (``dp_stats``: with ``feature_stats``, the
    ChannelStats released once per run by :func:`feature_norm.release`).
    """
    if config.activation == "tempered_sigmoid":
        activation = {"scale": config.scale, "inverse_temperature": config.inverse_temperature,
                      "offset": config.offset, "learnable": config.learnable}
    else:
        activation = config.activation
    if config.features == "scatternet":
        normalization = None
        if config.feature_norm == "dp_stats":
            if feature_stats is None:
                raise ConfigError("--feature_norm=dp_stats needs the released statistics: pass "
                                  "feature_stats=feature_norm.release(config, x_train).")
            normalization = (feature_stats.mean,
                             feature_stats.variance + feature_norm.VARIANCE_EPSILON)
        groups = config.norm_groups if config.feature_norm == "group" else None
        if config.head == "linear":
            return scatternet_linear(input_shape=dataset.input_shape,
                                     num_classes=dataset.num_classes, groups=groups,
                                     normalization=normalization, power=config.feature_power)
        return scatternet_cnn(activation, input_shape=dataset.input_shape,
                              num_classes=dataset.num_classes, groups=groups,
                              normalization=normalization, power=config.feature_power,
                              weight_standardization=config.weight_standardization)
    builder = {"digits": digits_cnn, "cifar10": cifar10_cnn}.get(config.dataset, mnist_cnn)
    return builder(activation, input_shape=dataset.input_shape, num_classes=dataset.num_classes)


def first_activation_layer(model):
    """The model's first activation layer (Activation or TemperedSigmoid)."""
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Activation, TemperedSigmoid)):
            return layer
    raise ValueError(f"model {model.name!r} has no activation layer.")
