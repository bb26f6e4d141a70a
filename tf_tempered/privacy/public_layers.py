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
"""Preprocessing state fit to data: refused unless declared public.

A Normalization adapted on the training set holds its mean and variance; a
TextVectorization or StringLookup adapted on it holds its vocabulary (the rare words of
single examples). That state is released with the model, and DP-SGD's ε does not cover
it, so a private model whose layers adapt() fit to data refuses to train until
``make_private(model, ..., public_layers=[name, ...])`` says that data was public (or
the state a DP release accounted on its own), or the layer is given its state instead.
"""

from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import NotPrivateError

__all__ = ["check_public_layers", "refuse_data_fitted_layers"]


def check_public_layers(public_layers, model):
    """``public_layers`` as a tuple of layer names of ``model``; ValueError naming it.

    >>> check_public_layers(None, None)
    ()
    """
    if public_layers is None:
        return ()
    if isinstance(public_layers, str) or not all(isinstance(n, str) for n in public_layers):
        raise ValueError(f"public_layers={public_layers!r} is invalid: give a list of layer "
                         "names, e.g. public_layers=['normalization'].")
    names = {layer.name for layer in keras_bridge.reachable_layers(model)}
    unknown = sorted(set(public_layers) - names)
    if unknown:
        raise ValueError(f"public_layers names {unknown}, which are not layers of model "
                         f"{model.name!r}. Fix: use names from [layer.name for layer in "
                         "model.layers] (nested models' layers included).")
    return tuple(public_layers)


def refuse_data_fitted_layers(model, public_layers):
    """Raises NotPrivateError for a layer whose state adapt() fit to data, unless public."""
    for layer, holds, instead in keras_bridge.data_fitted_layers(model):
        if layer.name in public_layers:
            continue
        raise NotPrivateError(
            f"Layer {layer.name!r} ({type(layer).__name__}) holds {holds} that its "
            "constructor was not given (fit to data by adapt(), or set afterwards, e.g. by "
            "set_vocabulary() or with a saved model): it is released with the model, and the "
            "ε DP-SGD reports does not cover it (adapted on the training data, it reveals "
            "that data). Fix: if it comes from public data, not the training data, say so: "
            "make_private(model, ..., "
            f"public_layers=[{layer.name!r}]); otherwise give it its state without the "
            f"private data: {instead}.")
