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
"""Keras internals about layers and models: traversal, ownership, Functional models,
registered activation names, the XLA grouped convolution (variables: variables.py)."""

import contextlib

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.keras_bridge.code_origin import keras_class_named
from tf_tempered.keras_bridge.recurrent import is_recurrent_unit

__all__ = ["flatten_layers", "sublayers", "inside_recurrent_units", "mixes_batch_examples", "is_trainable_batch_norm", "linear_activation", "lora_factors", "own_trainable_weights",
           "random_layers", "set_untracked", "without_activation", "step_losses", "unpack_x_y_sample_weight",
           "IS_KERAS3", "derived_weights", "depthwise_kernel",
           "einsum_dense_input_rank", "embedding_variant", "grouped_convolution_op",
           "is_functional_model", "layer_normalized_input", "register_activation_name",
           "declared_input_shapes"]

IS_KERAS3 = KERAS_MAJOR == 3


def flatten_layers(model, include_self=False):
    """Every layer of `model`, nested ones included (Keras' own traversal, both Kerases)."""
    # pylint: disable-next=protected-access
    return model._flatten_layers(include_self=include_self, recursive=True)


def sublayers(layer):
    """The layers ``layer`` holds directly (Keras' own traversal, one level; both Kerases)."""
    # pylint: disable-next=protected-access
    return list(layer._flatten_layers(include_self=False, recursive=False))


def inside_recurrent_units(model):
    """ids of the layers nested in a recurrent unit of `model` (cells, wrapped RNNs)."""
    nested = set()
    for layer in flatten_layers(model):
        if is_recurrent_unit(layer) and id(layer) not in nested:
            nested.update(id(sub) for sub in flatten_layers(layer))
    return nested


def random_layers(model):
    """The layers of `model` (itself and nested ones) that hold a random-number generator
    for their calls: Dropout, GaussianNoise, random augmentation layers, custom layers
    built on them (Keras 3: a SeedGenerator in ``_seed_generators``; tf-keras: a
    ``BaseRandomLayer``'s ``_random_generator``), but for those whose dropout rates are all 0."""
    found = []
    for layer in flatten_layers(model, include_self=True):
        rates = [getattr(layer, name) for name in ("rate", "dropout", "recurrent_dropout")
                 if isinstance(getattr(layer, name, None), (int, float))]
        if rates and not any(rates):
            # A Dropout of rate 0 (MultiHeadAttention's default) or a recurrent cell
            # without dropout (Keras 3 cells always hold a seed generator) draws nothing.
            continue
        if IS_KERAS3:
            if getattr(layer, "_seed_generators", None):
                found.append(layer)
        elif getattr(layer, "_random_generator", None) is not None:
            found.append(layer)
    return found


def own_trainable_weights(layer):
    """The trainable weights `layer` created itself (not its sub-layers'); [] if frozen.

    A recurrent unit (is_recurrent_unit) owns its sub-layers' weights too (its cell's).
    A sub-layer's weight that the layer also keeps as an attribute (SpectralNormalization's
    ``self.kernel = self.layer.kernel``: both Kerases then track it as the wrapper's own)
    stays the sub-layer's: one variable, one owner.
    """
    if not layer.trainable:
        return []
    if is_recurrent_unit(layer):
        unique = {}
        for v in layer.trainable_weights:  # Keras 3: a frozen variable is left out
            unique.setdefault(id(v), v)
        return list(unique.values())
    if IS_KERAS3:
        # Keras 3 keeps a layer's own variables in _trainable_variables; freezing one
        # (variable.trainable = False) leaves it in that list.
        own = [v for v in getattr(layer, "_trainable_variables", []) if v.trainable]
    else:
        own = list(getattr(layer, "_trainable_weights", []))
    if not own:
        return own
    nested = {id(v) for sub in flatten_layers(layer) for v in sub.weights}
    return [v for v in own if id(v) not in nested]


def lora_factors(layer):
    """(base kernel, A, B, alpha / rank) of a Keras 3 Dense or EinsumDense with LoRA enabled
    and no quantization (its kernel is base + (alpha / rank)·A@B), else None.

    `enable_lora` freezes the base kernel variable (`layer._kernel`; `layer.kernel` is then
    the merged tensor) and adds the float32 factors `lora_kernel_a` [*kernel_shape[:-1], r]
    and `lora_kernel_b` [r, kernel_shape[-1]]. tf-keras layers have no LoRA: None.
    """
    if not getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return None
    # pylint: disable-next=protected-access
    base = getattr(layer, "_kernel", None)
    a, b = getattr(layer, "lora_kernel_a", None), getattr(layer, "lora_kernel_b", None)
    if base is None or a is None or b is None:
        return None
    return base, a, b, float(layer.lora_alpha) / float(layer.lora_rank)


def layer_normalized_input(layer, x):
    """x̂ = ∂y/∂γ · 1 of a Keras 3 LayerNormalization (not rms_scaling) on input x: its own op
    with no γ or β, ``keras.ops.layer_normalization(x, None, None, axis, epsilon)``, cast to
    its compute dtype as its call casts y. None for anything else (tf-keras, rms_scaling, a
    subclass with its own call): the caller differentiates the layer's call instead.

    Keras 3 computes y = x·(inv·γ) + (β − mean·inv·γ), inv = rsqrt(var + ε), so
    ∂y/∂γ · 1 = x·inv − mean·inv, which is what the op returns without γ and β.
    """
    if not IS_KERAS3 or type(layer).call is not keras.layers.LayerNormalization.call:
        return None
    if getattr(layer, "rms_scaling", True) or not hasattr(keras.ops, "layer_normalization"):
        return None
    normalized = keras.ops.layer_normalization(x, None, None, axis=layer.axis,
                                               epsilon=layer.epsilon)
    return keras.ops.cast(normalized, layer.compute_dtype)


def set_untracked(obj, name, value):
    """Sets an attribute bypassing Keras' tracking: weight order, sub-layer lists
    and checkpoints stay as they were."""
    object.__setattr__(obj, name, value)


def unpack_x_y_sample_weight(data):
    return keras.utils.unpack_x_y_sample_weight(data)


# tf-keras' SyncBatchNormalization shares BatchNormalizationBase with BatchNormalization
# but is not a keras.layers.BatchNormalization; Keras 3 has one class (synchronized=True).
_BATCH_NORM_CLASS_NAMES = ("BatchNormalization", "BatchNormalizationBase",
                           "SyncBatchNormalization")


_BATCH_MIXING_CLASS_NAMES = ("MixUp", "CutMix")  # Keras 3's image augmentation layers


def mixes_batch_examples(layer):
    """True for a Keras layer that blends each example with another example of the batch
    when training (Keras 3's MixUp and CutMix): one example's data enters others' gradients."""
    return keras_class_named(layer, _BATCH_MIXING_CLASS_NAMES)


def is_trainable_batch_norm(layer):
    """True for a trainable batch normalization layer of either Keras (it normalizes with
    the batch's statistics when called in training mode)."""
    return layer.trainable and (
        isinstance(layer, keras.layers.BatchNormalization)
        or keras_class_named(layer, _BATCH_NORM_CLASS_NAMES))


linear_activation = keras.activations.linear


@contextlib.contextmanager
def without_activation(layer):
    """Within it, ``layer`` calls (and traces) with a linear activation: its output is the
    pre-activation z. Set untracked, so the layer's weights and sub-layers stay as they were."""
    activation = layer.activation
    set_untracked(layer, "activation", linear_activation)
    try:
        yield activation
    finally:
        set_untracked(layer, "activation", activation)


def step_losses(model):
    """The losses ``model.losses`` holds for the step being run: tf-keras also keeps, on a
    Functional model, the symbolic losses of its construction (an activity regularizer's),
    which the step never uses, traced or eager (DPGradients run eagerly refused such a
    model; probe Y), and eager values of a call before a traced step."""
    # (No tensor is made at import to learn EagerTensor's type: that would initialize TF's
    # devices, which a strategy's logical devices must precede.)
    if tf.executing_eagerly():
        return [loss for loss in model.losses
                if not isinstance(loss, tf.Tensor) or not tf.is_symbolic_tensor(loss)]
    graph = tf.compat.v1.get_default_graph()
    return [loss for loss in model.losses if not isinstance(loss, tf.Tensor)
            or (tf.is_symbolic_tensor(loss) and loss.graph is graph)]


def derived_weights(layer):
    """Why `layer`'s weights are not the plain variables its handler's math is for, or None.

    Keras 3 layers with LoRA (`lora_rank`, `enable_lora`) compute their kernel
    (embeddings) from frozen weights plus trainable low-rank factors, and
    quantized ones from integer weights and scales: `layer.kernel` is then a
    tensor, not the trainable variable. A handler refuses such a layer
    (hyperparameters returns None) so that it takes the next handler registered for
    its class (the LoRA handler, lora.py, for a Dense or EinsumDense with LoRA) or the
    generic per-example VJP, which is exact for them. Keras 2 layers have neither.
    """
    if getattr(layer, "lora_enabled", False):
        return "LoRA is enabled (its trainable weights are the low-rank factors)"
    mode = getattr(layer, "quantization_mode", None)
    if mode:
        return f"it is quantized ({mode})"
    return None


def depthwise_kernel(layer):
    """The depthwise kernel variable: Keras 3 names it `kernel`, Keras 2 `depthwise_kernel`."""
    return layer.depthwise_kernel if hasattr(layer, "depthwise_kernel") else layer.kernel


def einsum_dense_input_rank(layer, input_operand, output_operand):
    """The input rank of an EinsumDense layer: Keras 3 keeps it in ``input_spec``, tf-keras
    only the full output shape; else the equation's (None if it has an ellipsis)."""
    ndim = getattr(getattr(layer, "input_spec", None), "ndim", None)
    if ndim is not None:
        return int(ndim)
    if getattr(layer, "full_output_shape", None) is not None:
        return len(layer.full_output_shape) - len(output_operand.replace("...", "")) + len(
            input_operand.replace("...", ""))
    return None if "..." in input_operand else len(input_operand)


def embedding_variant(layer):
    """Why an Embedding's gradient is not the plain lookup's, or None: Keras 2's
    sparse=True (a SparseTensor output), or :func:`derived_weights` (Keras 3 LoRA, quantized)."""
    if getattr(layer, "sparse", False):
        return "it has sparse=True (SparseTensor output); only the dense lookup is supported"
    return derived_weights(layer)


def register_activation_name(name, function):
    """Makes the string `name` resolve to `function` in `activation=` arguments, on either Keras.

    Keras 2 resolves activation strings through its custom-object registry. Keras 3's
    ``keras.activations.get`` looks strings up in its table of built-in activations
    only (an internal dict), so the name is added there too. Either way a user's own
    `name`, registered first, is kept.
    """
    keras.utils.get_custom_objects().setdefault(name, function)
    if IS_KERAS3:
        from keras.src import activations as keras_activations  # pylint: disable=g-import-not-at-top
        keras_activations.ALL_OBJECTS_DICT.setdefault(name, function)


def is_functional_model(model):
    """True for a Functional (graph-of-layers) model, Sequential included, on either Keras."""
    if IS_KERAS3:
        # Keras 3 has no public name for the class of Functional models, of which its
        # Sequential is not a subclass.
        from keras.src.models.functional import Functional  # pylint: disable=g-import-not-at-top
        return isinstance(model, (Functional, keras.Sequential))
    # Keras 2 marks Functional models (and Sequential ones) as graph networks.
    return getattr(model, "_is_graph_network", False)


def declared_input_shapes(model):
    """[(name, TensorShape)] of the inputs a model declares, batch dimension included, in
    the order of its inputs: a Functional model's Inputs, or on tf-keras the shapes a
    subclassed model was first called with (its save spec); None if it declares none."""
    if is_functional_model(model):
        try:
            inputs = list(model.inputs or ())
        except (AttributeError, ValueError):  # Keras 3 Sequential not built yet
            return None
        return [(getattr(t, "name", None), tf.TensorShape(t.shape)) for t in inputs] or None
    if not IS_KERAS3 and model.save_spec() is not None:
        args, kwargs = model.save_spec()
        if not kwargs and len(args) == 1:
            return [(None, spec.shape) for spec in tf.nest.flatten(args)] or None
    return None


def grouped_convolution_op(layer):
    """tf-keras' XLA-compiled convolution of a grouped Conv layer, or None (Keras 3 has none).

    TF's CPU kernels differentiate a grouped convolution only XLA-compiled (or with
    oneDNN, float32 only), so tf-keras' Conv layers call this op when ``groups > 1``.
    """
    return getattr(layer, "_jit_compiled_convolution_op", None)
