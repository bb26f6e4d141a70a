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
"""How :func:`tf_tempered.swap_activations` rewrites a model's config: which activations match,
the new activation layers (split out of Dense, Conv and the like), the references renamed in
a Functional's nodes, and the weights copied into the rebuilt model.
"""

import copy
import itertools

from tf_tempered._compat import keras

__all__ = ["activation_name", "Swapper", "drop_build_configs"]

# Layers known to apply `activation` to their output and nothing after it; these are
# split into (layer with activation='linear') + a separate activation layer.
# Exact types only: a subclass may use `self.activation` differently.
_SPLIT_TYPES = tuple(
    getattr(keras.layers, name) for name in (
        "Dense", "EinsumDense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose",
        "Conv2DTranspose", "Conv3DTranspose", "SeparableConv1D", "SeparableConv2D",
        "DepthwiseConv1D", "DepthwiseConv2D", "LocallyConnected1D", "LocallyConnected2D")
    if hasattr(keras.layers, name))


def activation_name(activation):
    """Keras name of an activation function or activation layer, or None if it has none.

    >>> activation_name(keras.activations.relu), activation_name(keras.layers.ReLU())
    ('relu', 'relu')
    >>> activation_name(keras.layers.ReLU(max_value=6.0)), activation_name(len)
    ('relu6', None)
    """
    if isinstance(activation, keras.layers.Activation):
        return activation_name(activation.activation)
    if isinstance(activation, keras.layers.ReLU):
        config = activation.get_config()
        if float(config["negative_slope"]) != 0.0 or float(config["threshold"]) != 0.0:
            return None
        max_value = config["max_value"]
        if max_value is None:
            return "relu"
        return "relu6" if float(max_value) == 6.0 else None
    if isinstance(activation, keras.layers.ELU):
        return "elu" if float(activation.get_config()["alpha"]) == 1.0 else None
    if isinstance(activation, keras.layers.Layer) or not callable(activation):
        return None
    try:
        name = keras.activations.serialize(activation)
    except (ValueError, TypeError):
        return None
    # Custom functions serialize to a dict; only Keras's own have a plain name.
    return name if isinstance(name, str) else None


def _rename_refs(node_data, renames):
    """Points references [layer, node, tensor(, kwargs)] to renamed layers."""
    if isinstance(node_data, (list, tuple)):
        if (len(node_data) in (3, 4) and isinstance(node_data[0], str)
                and node_data[0] in renames and isinstance(node_data[1], int)
                and isinstance(node_data[2], int)):
            return ([renames[node_data[0]], node_data[1], node_data[2]]
                    + [_rename_refs(x, renames) for x in node_data[3:]])
        return [_rename_refs(x, renames) for x in node_data]
    if isinstance(node_data, dict):
        return {key: _rename_refs(value, renames) for key, value in node_data.items()}
    return node_data


class Swapper:
    """Rewrites configs level by level and remembers what it did."""

    def __init__(self, make_activation, names):
        self.make_activation = make_activation
        self.names = names
        self.count = 0
        self.custom_objects = {}
        # (model path, layer name) of layers that got the new activation inline.
        self.inline_hosts = set()
        self.copied = []  # (variable of the model, its copy's)

    def _activation_config(self, name, dtype):
        layer = self.make_activation()
        self._remember_classes(layer)
        layer_config = keras.layers.serialize(layer)
        layer_config["config"]["name"] = name
        if dtype is not None:
            # Follow the layer it replaces or follows, e.g. under mixed precision.
            layer_config["config"]["dtype"] = copy.deepcopy(dtype)
        return layer_config

    def _inline_value(self):
        layer = self.make_activation()
        self._remember_classes(layer)
        if type(layer) is keras.layers.Activation:  # pylint: disable=unidiomatic-typecheck
            return keras.activations.serialize(layer.activation)
        return keras.layers.serialize(layer)

    def _remember_classes(self, layer):
        # Unregistered custom layers and activation functions still rebuild.
        for obj in (layer, getattr(layer, "activation", None)):
            if isinstance(obj, keras.layers.Layer):
                self.custom_objects.setdefault(type(obj).__name__, type(obj))
                registered = keras.utils.get_registered_name(type(obj))
                self.custom_objects.setdefault(registered, type(obj))
            elif callable(obj) and getattr(obj, "__name__", "<lambda>") != "<lambda>":
                self.custom_objects.setdefault(obj.__name__, obj)

    def rewrite(self, model, config, path):
        """Rewrites `config`, the get_config() of `model`, in place."""
        is_functional = not isinstance(model, keras.Sequential)
        layers = {layer.name: layer for layer in model.layers}
        taken = {entry["config"]["name"] for entry in config["layers"]}
        new_entries, renames = [], {}
        for entry in config["layers"]:
            name = entry["config"]["name"]
            layer = layers.get(name)
            new_entries.append(entry)
            if layer is None:  # a Sequential's InputLayer
                continue
            self._remember_classes(layer)
            if isinstance(layer, keras.Model):
                self.rewrite(layer, entry["config"], f"{path}/{name}")
                continue
            if activation_name(layer) in self.names:
                # Same name and position: nothing downstream needs rewiring.
                new_entry = self._activation_config(name, entry["config"].get("dtype"))
                new_entry.update((k, entry[k]) for k in ("name", "inbound_nodes") if k in entry)
                new_entries[-1] = new_entry
                self.count += 1
                continue
            if activation_name(getattr(layer, "activation", None)) not in self.names:
                continue
            if "activation" not in entry["config"]:
                raise ValueError(
                    f"swap_activations: layer {name!r} in {path!r} has a matching "
                    "`activation` but no 'activation' in its get_config(), so it cannot be "
                    "rebuilt with another one. Fix: add it to the layer's get_config().")
            self.count += 1
            if type(layer) not in _SPLIT_TYPES:
                entry["config"]["activation"] = self._inline_value()
                self.inline_hosts.add((path, name))
                continue
            entry["config"]["activation"] = "linear"
            act_name = next(candidate for candidate in itertools.chain(
                [f"{name}_act"], (f"{name}_act_{i}" for i in itertools.count(1)))
                if candidate not in taken)
            taken.add(act_name)
            act_entry = self._activation_config(act_name, entry["config"].get("dtype"))
            if is_functional:
                renames[name] = act_name
                act_entry["name"] = act_name
                act_entry["inbound_nodes"] = [
                    [[name, node_index, 0, {}]]
                    for node_index in range(len(entry["inbound_nodes"]))]
            new_entries.append(act_entry)
        if renames:
            for entry in new_entries:
                if entry["config"]["name"] not in renames.values():
                    entry["inbound_nodes"] = _rename_refs(entry["inbound_nodes"], renames)
            config["output_layers"] = _rename_refs(config["output_layers"], renames)
        config["layers"] = new_entries

    def copy_weights(self, old_model, new_model, path):
        for old in old_model.layers:
            new = new_model.get_layer(old.name)
            if isinstance(old, keras.Model):
                self.copy_weights(old, new, f"{path}/{old.name}")
                continue
            if not old.weights:
                continue
            targets = new.weights
            if (path, old.name) in self.inline_hosts:
                added = {id(v) for v in getattr(new.activation, "weights", ())}
                targets = [v for v in targets if id(v) not in added]
            values = old.get_weights()
            if len(targets) != len(values) or any(
                    tuple(v.shape) != w.shape for v, w in zip(targets, values)):
                raise ValueError(  # a bug here, not a user error
                    f"swap_activations: cannot copy the weights of layer {old.name!r} in "
                    f"{path!r}: shapes {[w.shape for w in values]} vs "
                    f"{[tuple(v.shape) for v in targets]}.")
            for variable, value in zip(targets, values):
                variable.assign(value)
            self.copied += zip(old.weights, targets)


def drop_build_configs(config):
    """tf-keras built the layers of a rewritten nested Sequential from their ``build_config``
    outside the model's name scope: weights named ``kernel:0`` without their layer's name, so
    an HDF5 save of the copy failed ("name already exists"; probe T F4). Without it each layer
    is built when its model calls it (Input) or builds (``build_input_shape``), as Keras does."""
    if isinstance(config, dict):
        config.pop("build_config", None)
        for value in config.values():
            drop_build_configs(value)
    elif isinstance(config, list):
        for value in config:
            drop_build_configs(value)
