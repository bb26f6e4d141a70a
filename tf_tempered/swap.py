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
"""Swap the activations of an existing Keras model, e.g. ReLU for tempered sigmoids.

:func:`swap_activations` rebuilds a Sequential or Functional model (branches,
residual connections and nested Sequential/Functional sub-models included) from
its config, with every matching activation replaced by a fresh layer from
:func:`tf_tempered.models.resolve_activation`, and copies every kept weight.
"""

import copy

from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.keras_bridge import is_functional_model
from tf_tempered.models import resolve_activation
from tf_tempered.privacy import weight_files
from tf_tempered.swap_configs import Swapper, activation_name, drop_build_configs

__all__ = ["swap_activations"]


def _check_replace(replace):
    if isinstance(replace, str):
        replace = (replace,)
    if not isinstance(replace, (tuple, list, set, frozenset)) or not replace:
        raise ValueError(
            f"swap_activations: `replace` must be a non-empty tuple of Keras activation "
            f"names, got {replace!r}. Fix: e.g. replace=('relu',) or ('relu', 'elu').")
    names = set()
    for name in replace:
        canonical = None
        if isinstance(name, str):
            try:
                canonical = activation_name(keras.activations.get(name))
            except ValueError:
                pass
        if canonical is None:
            raise ValueError(
                f"swap_activations: `replace` entry {name!r} is not a Keras activation "
                f"name. Fix: use names such as 'relu', 'elu', 'tanh', 'sigmoid'.")
        if canonical == "linear":
            raise ValueError(
                "swap_activations: `replace` may not contain 'linear': every layer "
                "without an activation, the logits included, would get one. Fix: add "
                "activation layers where you want them and swap those.")
        names.add(canonical)
    return frozenset(names)


def _check_model(model, where):
    """Raises TypeError unless `model` and every model nested in it can be rebuilt."""
    if isinstance(model, keras.Model) and (
            # A subclassed model's wiring lives in Python code, not in a config.
            isinstance(model, keras.Sequential) or is_functional_model(model)):
        for layer in model.layers:
            if isinstance(layer, keras.Model):
                _check_model(layer, f"nested model in {model.name!r}")
        return
    if isinstance(model, keras.Model):
        raise TypeError(
            f"swap_activations: {where} {model.name!r} is a subclassed model "
            f"({type(model).__name__}), whose wiring lives in its call() code and cannot "
            "be rebuilt. Fix: build it as a Functional or Sequential model, or change the "
            "activations in its code (e.g. pass tf_tempered.layers.TemperedSigmoid()).")
    raise TypeError(
        f"swap_activations: {where} must be a keras.Sequential or Functional "
        f"keras.Model, got {type(model).__name__}.")


def swap_activations(model, activation, *, replace=("relu",), return_count=False):
    """Returns a copy of `model` with its `replace` activations swapped for `activation`.

    Matches, wherever they are (branches, residual blocks, nested Sequential or
    Functional sub-models):

    * an ``activation=`` on any layer, e.g. ``Dense(.., activation='relu')`` or
      ``keras.activations.relu``;
    * ``keras.layers.Activation(name)`` layers;
    * plain ``keras.layers.ReLU()`` layers for ``'relu'`` (a ``ReLU(max_value=6)``
      is ``'relu6'``, and leaky or thresholded ones match nothing), and
      ``keras.layers.ELU(alpha=1.0)`` for ``'elu'``.

    Activation layers are replaced in place, keeping their names. A Dense, Conv or
    other built-in layer that applies its ``activation`` to its output becomes
    that layer with ``activation='linear'`` followed by a new activation layer
    named ``<layer>_act``, rather than holding the new activation inside it:
    every activation is then a layer of its own, as in :mod:`tf_tempered.models`,
    with its own (learnable) weights visible to DP engines. (TF Privacy's fast
    gradient clipping, for one, strips a Dense's activation and would miss the
    gradients of weights hidden there, under-counting per-example gradient
    norms.) Other layers with an ``activation`` (recurrent layers, custom layers)
    get the new activation inline. Either way the result saves to ``.keras``
    and HDF5 and loads back without ``custom_objects``.

    Args:
        model: a ``keras.Sequential`` or Functional ``keras.Model``; left untouched.
        activation: any form :func:`tf_tempered.models.resolve_activation` accepts;
            each replaced position gets a fresh layer.
        replace: Keras activation names to replace, e.g. ``('relu', 'elu')``.
        return_count: if True, also return the number of activations replaced.

    Returns:
        A new model of the same kind (Sequential or Functional), uncompiled (compile
        it yourself), with every other layer's config and weights copied; or
        ``(model, count)`` when ``return_count``. Weights trained under DP bring their
        privacy ledger: a plain fit of their copies is refused (as after ``load_weights``),
        and ``make_private`` on the copy goes on counting their steps.

    Raises:
        TypeError: for a subclassed model (rebuild it as Functional, or change the
            activations in its code).
        ValueError: for a bad ``activation`` or ``replace``.

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"),
    ...                           keras.layers.ReLU(), keras.layers.Dense(2)])
    >>> swapped, count = swap_activations(model, "tempered_sigmoid", return_count=True)
    >>> count, [type(layer).__name__ for layer in swapped.layers]
    (2, ['Dense', 'TemperedSigmoid', 'TemperedSigmoid', 'Dense'])
    """
    make_activation = resolve_activation(activation)
    names = _check_replace(replace)
    _check_model(model, "`model`")
    swapper = Swapper(make_activation, names)
    config = copy.deepcopy(model.get_config())
    swapper.rewrite(model, config, model.name)
    if KERAS_MAJOR == 2:
        drop_build_configs(config)
    cls = keras.Sequential if isinstance(model, keras.Sequential) else keras.Model
    new_model = cls.from_config(config, custom_objects=swapper.custom_objects)
    swapper.copy_weights(model, new_model, model.name)
    # Trained under DP: a plain update of the copy is refused, make_private goes on counting.
    weight_files.carry_dp(model, new_model, swapper.copied)
    return (new_model, swapper.count) if return_count else new_model
