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
"""Preprocessing layers whose state ``adapt()`` fit to data (Normalization, lookups...).

That state (a mean and variance, a vocabulary, bin boundaries) is a release about the
data it was adapted on, saved with the model and outside DP-SGD's ε. Both Kerases' layers
are read: state not given to the constructor and not the default one (set by adapt(), by
``set_vocabulary()``, or by loading a saved model whose layer was adapted). tf-keras also
marks a layer adapted in this process (``is_adapted``), a flag it does not save.

Besides the model's layers, those a ``Lambda``'s function reaches by name (its closure,
default arguments and the globals it names, two calls deep: ``Lambda(lambda s: tv(s))``)
are read; a layer reached another way (an attribute of an object the function names) is
not seen.
"""

import types

import numpy as np

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.keras_bridge.layers import flatten_layers

__all__ = ["data_fitted_layers", "reachable_layers"]

# What each kind holds, and how to give it without the private data.
_KINDS = {
    "Normalization": ("a mean and variance", "Normalization(mean=..., variance=...) from public "
                      "data, or from statistics released with DP (tf_tempered.feature_stats) "
                      "composed into ε by PrivacyBudget(prior_events=...)"),
    "Discretization": ("bin boundaries", "Discretization(bin_boundaries=...) fixed in advance "
                       "or from public data"),
    "TextVectorization": ("a vocabulary", "TextVectorization(vocabulary=...) from public text"),
    "StringLookup": ("a vocabulary", "StringLookup(vocabulary=...) from public data"),
    "IntegerLookup": ("a vocabulary", "IntegerLookup(vocabulary=...) from public data"),
}


def data_fitted_layers(model):
    """[(layer, what it holds, how to set it instead)] for the layers of ``model`` whose
    state adapt() fit to data."""
    layers = reachable_layers(model)
    # Keras 3's TextVectorization holds a StringLookup: the outer layer answers for it.
    inner = {id(getattr(layer, "_lookup_layer", None)) for layer in layers}
    found = []
    for layer in layers:
        kind = next((c.__name__ for c in type(layer).__mro__ if c.__name__ in _KINDS), None)
        if kind is not None and id(layer) not in inner and _adapted(layer, kind):
            found.append((layer,) + _KINDS[kind])
    return found


def reachable_layers(model):
    """The layers of ``model`` (nested ones included) and those its Lambdas' functions
    name (module docstring)."""
    layers = list(flatten_layers(model))
    seen = {id(layer) for layer in layers}
    for layer in list(layers):
        if type(layer).__name__ == "Lambda":
            for found in _layers_named_by(getattr(layer, "function", None)):
                for sub in [found, *flatten_layers(found)]:
                    if id(sub) not in seen:
                        seen.add(id(sub))
                        layers.append(sub)
    return layers


def _layers_named_by(function, depth=2):
    """The Keras layers ``function`` names: closure cells, default arguments and the
    globals its code names, and those of the functions it names (``depth`` levels)."""
    if isinstance(function, keras.layers.Layer):
        return [function]
    code = getattr(function, "__code__", None)
    if code is None or depth == 0:
        return []
    values = [cell.cell_contents for cell in (function.__closure__ or ())
              if _filled(cell)]
    values += list(function.__defaults__ or ())
    scope = getattr(function, "__globals__", {})
    values += [scope[name] for name in code.co_names if name in scope]
    found = []
    for value in values:
        if isinstance(value, keras.layers.Layer):
            found.append(value)
        elif isinstance(value, types.FunctionType):
            found.extend(_layers_named_by(value, depth - 1))
    return found


def _filled(cell):
    try:
        cell.cell_contents  # pylint: disable=pointless-statement
    except ValueError:  # a cell not assigned yet
        return False
    return True


def _adapted(layer, kind):
    if KERAS_MAJOR == 2 and getattr(layer, "is_adapted", False):
        return True
    if kind == "Normalization":  # adapt() fills adapt_mean/variance (zeros/ones before)
        if getattr(layer, "input_mean", None) is not None or not hasattr(layer, "adapt_mean"):
            return False
        with tf.init_scope():  # read the variables eagerly, also while a step is traced
            mean, variance = np.asarray(layer.adapt_mean), np.asarray(layer.adapt_variance)
        return bool(np.any(mean != 0) or np.any(variance != 1))
    if kind == "Discretization":  # num_bins asks adapt() for the boundaries
        return layer.num_bins is not None and layer.bin_boundaries is not None
    lookup = getattr(layer, "_lookup_layer", layer)  # TextVectorization holds a StringLookup
    if getattr(lookup, "input_vocabulary", None) is not None:
        return False
    special = lookup.num_oov_indices + (lookup.mask_token is not None)
    with tf.init_scope():  # the table's size eagerly, also while a step is traced
        return int(lookup.vocabulary_size()) > special
