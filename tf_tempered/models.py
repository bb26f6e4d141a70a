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
"""The paper's CNNs (Papernot et al., AAAI 2021, Tables 1 and 2) with a pluggable activation.

MNIST / Fashion-MNIST (Table 1; the same CNN as TF Privacy's tutorial and JAX's
DP-SGD example), 26,010 parameters on 28×28×1 inputs::

    Conv2D 16, 8×8, stride 2, 'same'   + act
    MaxPool 2×2, stride 1
    Conv2D 32, 4×4, stride 2, 'valid'  + act
    MaxPool 2×2, stride 1
    Flatten
    Dense 32                           + act
    Dense num_classes                  (logits)

CIFAR-10 (Table 2), 605,226 parameters on 32×32×3 inputs; every conv is 3×3,
stride 1, 'same'::

    Conv2D 32 + act, Conv2D 32 + act,   AvgPool 2×2, stride 2
    Conv2D 64 + act, Conv2D 64 + act,   AvgPool 2×2, stride 2
    Conv2D 128 + act, Conv2D 128 + act, AvgPool 2×2, stride 2
    Conv2D 256 + act
    Conv2D num_classes                  (logits)
    GlobalAveragePooling2D

Each activation is its own layer, a fresh instance per position, so a learnable
tempered sigmoid gets its own (s, T, o) at every position (the paper's
layer-wise parameters), and DP engines see it as a layer of its own. The models
are Functional, with an explicit ``keras.Input``, and output logits.
"""

import math
import numbers

from tf_tempered._compat import keras
from tf_tempered.layers import TemperedSigmoid

__all__ = ["resolve_activation", "mnist_cnn", "cifar10_cnn", "MNIST_CNN_LAYOUT",
           "CIFAR10_CNN_LAYOUT"]

# The placeholder for the class count in the layouts below.
NUM_CLASSES = "num_classes"

# (name, kind, keyword arguments); "act" is the pluggable activation, named by Keras.
MNIST_CNN_LAYOUT = (
    ("conv1", "conv2d", {"filters": 16, "kernel_size": 8, "strides": 2, "padding": "same"}),
    (None, "act", {}),
    ("pool1", "max_pool2d", {"pool_size": 2, "strides": 1}),
    ("conv2", "conv2d", {"filters": 32, "kernel_size": 4, "strides": 2, "padding": "valid"}),
    (None, "act", {}),
    ("pool2", "max_pool2d", {"pool_size": 2, "strides": 1}),
    ("flatten", "flatten", {}),
    ("dense1", "dense", {"units": 32}),
    (None, "act", {}),
    ("logits", "dense", {"units": NUM_CLASSES}),
)


def _conv3x3(name, filters):
    return (name, "conv2d", {"filters": filters, "kernel_size": 3, "strides": 1,
                             "padding": "same"})


CIFAR10_CNN_LAYOUT = (
    _conv3x3("conv1", 32), (None, "act", {}),
    _conv3x3("conv2", 32), (None, "act", {}),
    ("pool1", "avg_pool2d", {"pool_size": 2, "strides": 2}),
    _conv3x3("conv3", 64), (None, "act", {}),
    _conv3x3("conv4", 64), (None, "act", {}),
    ("pool2", "avg_pool2d", {"pool_size": 2, "strides": 2}),
    _conv3x3("conv5", 128), (None, "act", {}),
    _conv3x3("conv6", 128), (None, "act", {}),
    ("pool3", "avg_pool2d", {"pool_size": 2, "strides": 2}),
    _conv3x3("conv7", 256), (None, "act", {}),
    _conv3x3("logits", NUM_CLASSES),
    ("global_pool", "global_avg_pool2d", {}),
)

_LAYER_CLASSES = {
    "conv2d": keras.layers.Conv2D,
    "dense": keras.layers.Dense,
    "max_pool2d": keras.layers.MaxPool2D,
    "avg_pool2d": keras.layers.AveragePooling2D,
    "flatten": keras.layers.Flatten,
    "global_avg_pool2d": keras.layers.GlobalAveragePooling2D,
}

_TEMPERED_KEYS = ("scale", "inverse_temperature", "offset", "learnable")

_ACCEPTED_FORMS = (
    "Accepted forms: 'tempered_sigmoid' (s, T, o = 2, 2, 1), 'relu', 'tanh' or any other "
    "Keras activation name; an (s, T, o) tuple or list of three numbers, e.g. (1.5, 3.0, "
    "0.5); a dict with keys among 'scale', 'inverse_temperature', 'offset', 'learnable', "
    "e.g. {'scale': 1.5, 'learnable': True}; or a Keras layer instance, e.g. "
    "TemperedSigmoid(learnable=True), cloned afresh for every position.")


def _is_int(value):
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _bad_activation(activation, why):
    return ValueError(f"`activation` {why}, got {activation!r}. {_ACCEPTED_FORMS}")


def _layer_factory(layer):
    if isinstance(layer, keras.Model):
        raise _bad_activation(layer, "must be an activation layer, not a model")
    try:
        config = layer.get_config()
    except NotImplementedError as e:
        raise _bad_activation(
            layer, "is a layer without get_config(), so it cannot be cloned per "
            "position; implement get_config() or pass a string/tuple/dict") from e
    # Drop the name, so that every clone gets a fresh unique one.
    config.pop("name", None)
    cls = layer.__class__
    return lambda: cls.from_config(dict(config))


def _tempered_factory(activation, kwargs):
    try:
        TemperedSigmoid(**kwargs)  # validates now, not at the first model build
    except ValueError as e:
        raise ValueError(f"`activation` {activation!r} is not a valid tempered sigmoid: "
                         f"{e}") from e
    return lambda: TemperedSigmoid(**kwargs)


def resolve_activation(activation):
    """Turns an activation spec into a zero-argument factory of FRESH activation layers.

    Args:
        activation: ``'tempered_sigmoid'`` (defaults (2, 2, 1), i.e. tanh),
            ``'relu'``, ``'tanh'`` or another Keras activation name (a
            ``keras.layers.Activation``); an ``(s, T, o)`` tuple/list (a fixed
            ``TemperedSigmoid``); a dict of ``TemperedSigmoid`` arguments
            (``scale``, ``inverse_temperature``, ``offset``, ``learnable``); or a
            Keras layer instance, cloned through ``get_config``/``from_config`` (its
            weights are not copied).

    Returns:
        A callable that returns a new, unbuilt layer on every call, so each
        position in a network gets its own weights.

    Raises:
        ValueError: for anything else, listing the accepted forms.

    >>> make = resolve_activation({"scale": 1.5, "offset": 0.5, "learnable": True})
    >>> first, second = make(), make()
    >>> first is second, type(first).__name__, first.learnable
    (False, 'TemperedSigmoid', True)
    >>> type(resolve_activation("relu")()).__name__
    'Activation'
    """
    if isinstance(activation, str):
        if activation == "tempered_sigmoid":
            return _tempered_factory(activation, {})
        try:
            keras.activations.get(activation)
        except ValueError as e:
            raise _bad_activation(activation, "is not a known activation name") from e
        return lambda: keras.layers.Activation(activation)
    if isinstance(activation, (tuple, list)):
        if len(activation) != 3:
            raise _bad_activation(activation, f"as a tuple must have 3 numbers (s, T, o), "
                                              f"not {len(activation)}")
        scale, inverse_temperature, offset = activation
        return _tempered_factory(activation, {"scale": scale, "offset": offset,
                                              "inverse_temperature": inverse_temperature})
    if isinstance(activation, dict):
        unknown = sorted(str(key) for key in activation if key not in _TEMPERED_KEYS)
        if unknown:
            raise _bad_activation(activation, f"has unknown keys {unknown}")
        return _tempered_factory(activation, dict(activation))
    if isinstance(activation, keras.layers.Layer):
        return _layer_factory(activation)
    raise _bad_activation(activation, f"has an unsupported type {type(activation).__name__}")


def _check_input_shape(input_shape, builder):
    if (not isinstance(input_shape, (tuple, list)) or len(input_shape) != 3
            or not all(_is_int(d) and d > 0 for d in input_shape)):
        raise ValueError(
            f"{builder}: `input_shape` must be (height, width, channels), three positive "
            f"integers without the batch dimension, got {input_shape!r}. Fix: e.g. "
            "input_shape=(28, 28, 1) for MNIST or (32, 32, 3) for CIFAR-10.")
    return tuple(int(d) for d in input_shape)


def _check_num_classes(num_classes, builder):
    if not _is_int(num_classes) or num_classes < 1:
        raise ValueError(
            f"{builder}: `num_classes` must be a positive integer, got {num_classes!r}. "
            "Fix: pass the number of classes, e.g. num_classes=10.")
    return int(num_classes)


def _spatial_out(size, kind, kwargs):
    """Output height/width of one layout entry, or None where the size stays as is."""
    if kind not in ("conv2d", "max_pool2d", "avg_pool2d"):
        return None
    kernel = kwargs.get("kernel_size", kwargs.get("pool_size"))
    strides = kwargs.get("strides", 1)
    if kwargs.get("padding", "valid") == "same":
        return math.ceil(size / strides)
    return (size - kernel) // strides + 1 if size >= kernel else 0


def _smallest_layer(layout, size):
    """Name of the first layer whose output would be empty at this input size."""
    for name, kind, kwargs in layout:
        out = _spatial_out(size, kind, kwargs)
        if out is not None:
            if out < 1:
                return name
            size = out
    return None


def _check_spatial(layout, input_shape, builder):
    for axis, size in zip(("height", "width"), input_shape[:2]):
        culprit = _smallest_layer(layout, size)
        if culprit is not None:
            minimum = next(n for n in range(1, 1024) if _smallest_layer(layout, n) is None)
            raise ValueError(
                f"{builder}: `input_shape` {input_shape!r} is too small: its {axis} {size} "
                f"leaves nothing after layer {culprit!r}. Fix: use inputs of at least "
                f"{minimum}×{minimum} (resize or pad the images).")


def _build(layout, activation, input_shape, num_classes, name, builder):
    input_shape = _check_input_shape(input_shape, builder)
    num_classes = _check_num_classes(num_classes, builder)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{builder}: `name` must be a non-empty string, got {name!r}.")
    _check_spatial(layout, input_shape, builder)
    make_activation = resolve_activation(activation)

    inputs = keras.Input(shape=input_shape, name="image")
    x = inputs
    for layer_name, kind, kwargs in layout:
        if kind == "act":
            x = make_activation()(x)
            continue
        kwargs = {k: num_classes if v == NUM_CLASSES else v for k, v in kwargs.items()}
        x = _LAYER_CLASSES[kind](name=layer_name, **kwargs)(x)
    # A plain model: to train it with DP-SGD, pass it to tf_tempered.make_private.
    return keras.Model(inputs, x, name=name)


def mnist_cnn(activation="tempered_sigmoid", *, input_shape=(28, 28, 1), num_classes=10,
              name="mnist_cnn"):
    """The paper's MNIST / Fashion-MNIST CNN (Table 1), outputting logits.

    Args:
        activation: any form :func:`resolve_activation` accepts.
        input_shape: (height, width, channels), at least 13×13.
        num_classes: width of the logits layer.
        name: the model's name.

    Returns:
        A plain, uncompiled Functional ``keras.Model`` of the active Keras. For DP-SGD
        pass it to :func:`tf_tempered.make_private` once, e.g.
        ``tf_tempered.make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)``,
        then compile it with any Keras loss (the engine takes it per example).

    >>> model = mnist_cnn()
    >>> model.count_params(), model.output_shape
    (26010, (None, 10))
    """
    return _build(MNIST_CNN_LAYOUT, activation, input_shape, num_classes, name, "mnist_cnn")


def cifar10_cnn(activation="tempered_sigmoid", *, input_shape=(32, 32, 3), num_classes=10,
                name="cifar10_cnn"):
    """The paper's CIFAR-10 CNN (Table 2), outputting logits.

    Args:
        activation: any form :func:`resolve_activation` accepts.
        input_shape: (height, width, channels), at least 8×8.
        num_classes: channels of the last conv, averaged into the logits.
        name: the model's name.

    Returns:
        A plain, uncompiled Functional ``keras.Model`` of the active Keras. For DP-SGD
        pass it to :func:`tf_tempered.make_private` once, e.g.
        ``tf_tempered.make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)``,
        then compile it with any Keras loss (the engine takes it per example).

    >>> model = cifar10_cnn("relu")
    >>> model.count_params(), model.output_shape
    (605226, (None, 10))
    """
    return _build(CIFAR10_CNN_LAYOUT, activation, input_shape, num_classes, name,
                  "cifar10_cnn")
