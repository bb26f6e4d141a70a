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
"""The EinsumDense handler: the Dense row math (rows.py) on the equation's rows.

With a row-form equation, an EinsumDense is a Dense layer on rows a [B, R, d_in] and
g [B, R, d_out]: ghost norm or materialized gradients and the book-keeping sum come from
rows.py, and the kernel gradient goes back to the kernel's layout with kernel_from_matrix.
The bias rides in the ghost norm as a column of ones where that is valid (every
MultiHeadAttention projection), else it is summed per example (per_example_bias_grads).
Equations without row form and quantized layers take the generic path; LoRA layers the
LoRA handler (lora.py) where it applies.

The equation's row form, its rows and the kernel layout are in einsum_equation.py.

The bias (``bias_axes``, letters of the output) gets, per example, the output
gradient summed over every other non-batch output axis, laid out like the bias
variable (Keras' layout: the output axes from the first bias letter on, with size
1 on the non-bias ones): see :func:`bias_rows`, :func:`per_example_bias_grads`,
:func:`bias_variable_shape` and, for the ghost norm's ones-column trick,
:func:`ones_column_valid`.

Only :func:`einsum_dense_hyperparameters` looks at a layer (tf-keras or Keras 3).
"""

import dataclasses

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import UnsupportedEinsumError
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult
from tf_tempered.privacy.layer_grads.registry import register
from tf_tempered.privacy.layer_grads.einsum_equation import (
    axis_size, einsum_rows, kernel_from_matrix, parse_equation, refusal, size_product,
    split_operands, to_rows)

__all__ = ["EinsumDenseHandler", "EinsumDenseHyperparameters", "bias_from_kernel_columns",
           "bias_rows", "bias_variable_shape", "einsum_dense_hyperparameters",
           "ones_column_valid", "per_example_bias_grads"]


def _bias_letters(form, bias_axes):
    """The bias letters in output order (the bias variable's order); checks them."""
    if not bias_axes:
        raise ValueError(f"EinsumDense {form.equation!r} has no bias (bias_axes={bias_axes!r}).")
    if len(set(bias_axes)) != len(bias_axes):
        raise ValueError(f"bias_axes {bias_axes!r} repeats a letter.")
    for c in bias_axes:
        if c not in form.output_spec or c in form.ellipsis:
            raise ValueError(f"bias axis {c!r} is not a letter of the output of {form.equation!r}.")
    if form.batch in bias_axes:
        raise refusal(form.equation, f"the bias spans the batch axis {form.batch!r}")
    return "".join(c for c in form.output_spec if c in bias_axes)


def bias_variable_shape(equation, bias_axes, output_shape):
    """The bias variable's shape as Keras builds it (tf-keras and Keras 3 alike).

    The output axes from the first bias letter to the last output axis (ellipsis
    axes included when they trail), with the output's size on bias letters and 1
    elsewhere, so that the bias broadcasts against the output. output_shape: the
    full output shape (batch first), static sizes for the bias letters.
    """
    form = parse_equation(equation, output_rank=len(output_shape))
    letters = _bias_letters(form, bias_axes)
    first = min(form.output_spec.index(c) for c in letters)
    return tuple(int(output_shape[i]) if c in letters else 1
                 for i, c in enumerate(form.output_spec) if i >= first)


def bias_rows(equation, bias_axes, g):
    """The output gradient as bias rows [B, R_b, d_b]; Σ over R_b is each example's bias gradient.

    d_b flattens the bias letters in output order, which is the element order of
    the bias variable (its other axes have size 1), so ``reshape(Σ_r rows, [B,
    *bias_variable_shape])`` is laid out like the bias; R_b flattens every other
    non-batch output axis. As for a Dense kernel, ‖Σ_r g_r‖² = Σ_{r,s} g_r·g_s.

    When :func:`ones_column_valid` holds, R_b and d_b are the kernel's rows and
    d_out columns (up to the order of the columns), and the bias can instead ride
    in the ghost norm as an input column of ones (see there).
    """
    g = tf.convert_to_tensor(g)
    form = parse_equation(equation, output_rank=g.shape.rank)
    letters = _bias_letters(form, bias_axes)
    others = "".join(c for c in form.output_spec[1:] if c not in letters)
    return to_rows(g, form.output_spec, form.batch, others, letters)


def per_example_bias_grads(equation, bias_axes, g, *, flat=True):
    """Each example's bias gradient: [B, bias size] (``flat``) or [B, *bias variable shape]."""
    grads = tf.reduce_sum(bias_rows(equation, bias_axes, g), 1)
    if flat:
        return grads
    g = tf.convert_to_tensor(g)
    shape = bias_variable_shape(equation, bias_axes, [axis_size(g, i) for i in range(g.shape.rank)])
    return tf.reshape(grads, [axis_size(grads, 0), *shape])


def ones_column_valid(equation, bias_axes):
    """Whether the bias may join the kernel's ghost norm as an input column of ones.

    Appending a constant 1 to every a_r makes Σ_r [a_r; 1] g_rᵀ stack the kernel
    gradient on Σ_r g_r, so Σ_{r,s} (a_r·a_s + 1)(g_r·g_s) is the kernel's plus the
    bias's squared norm, and the book-keeping sum Σ_r c g_r is the clipped bias.
    That Σ_r g_r is the bias gradient only when the bias sums over exactly the
    kernel's rows, i.e. when the bias letters are exactly the d_out letters (true
    for plain Dense-like equations and every MultiHeadAttention projection). The
    order of the columns may differ (d_out is in kernel order, the bias in output
    order): norms do not care, a bias value needs :func:`bias_from_kernel_columns`.
    Otherwise (a bias over some row axes, or over only part of d_out) use
    :func:`per_example_bias_grads` / :func:`bias_rows` separately.
    """
    if not bias_axes:
        return False
    form = parse_equation(equation)
    return sorted(_bias_letters(form, bias_axes)) == sorted(form.d_out)


def bias_from_kernel_columns(equation, bias_axes, columns, kernel_shape):
    """[..., d_out] sums of g rows (kernel column order) → [..., bias size] in bias order.

    Only meaningful when :func:`ones_column_valid`; e.g. the book-keeping bias
    Σ_r c_{m(r)} g_r summed from :func:`einsum_rows`' g rows.
    """
    form = parse_equation(equation)
    if not ones_column_valid(equation, bias_axes):
        raise ValueError(f"bias_axes {bias_axes!r} of {equation!r} are not the kernel's "
                         f"output letters {form.d_out!r}.")
    letters = _bias_letters(form, bias_axes)
    if letters == form.d_out:
        return tf.convert_to_tensor(columns)
    size = dict(zip(form.kernel_spec, [int(s) for s in kernel_shape]))
    columns = tf.convert_to_tensor(columns)
    lead = columns.shape.rank - 1
    lead_shape = [axis_size(columns, i) for i in range(lead)]
    t = tf.reshape(columns, lead_shape + [size[c] for c in form.d_out])
    t = tf.transpose(t, list(range(lead)) + [lead + form.d_out.index(c) for c in letters])
    return tf.reshape(t, lead_shape + [size_product([size[c] for c in letters])])


@dataclasses.dataclass(frozen=True)
class EinsumDenseHyperparameters:
    """Plain values of a built EinsumDense: all the row reduction needs.

    bias_axes is None when the layer has no bias; bias_shape likewise; input_rank
    is the rank the layer was built for (it expands an ellipsis); activation is
    the name of the layer's activation, None for linear (the output gradient
    must then be taken before it).
    """
    equation: str
    bias_axes: object
    kernel_shape: tuple
    bias_shape: object
    input_rank: int
    activation: object = None


def einsum_dense_hyperparameters(layer):
    """Plain hyperparameters of a built tf-keras or Keras 3 EinsumDense (equation, bias_axes, ...).

    Both Keras versions store ``equation``, ``bias_axes`` and ``partial_output_shape``
    and build ``kernel`` and ``bias`` (None without bias_axes). The input rank is
    Keras 3's ``input_spec.ndim``, or from tf-keras' ``full_output_shape`` (output
    rank) and the equation. Keras 3 layers with LoRA or quantization are refused
    (UnsupportedEinsumError): their trainable variables are not (kernel, bias).
    Does not check row form; :func:`parse_equation` does.
    """
    if not getattr(layer, "built", False):
        raise ValueError(f"EinsumDense layer {layer.name!r} is not built yet.")
    if keras_bridge.derived_weights(layer):
        raise UnsupportedEinsumError(
            f"EinsumDense layer {layer.name!r} uses LoRA or quantization; its trainable "
            "variables are not (kernel, bias), so it needs the generic fallback.")
    equation = str(layer.equation)
    input_spec, _, output_spec = split_operands(equation)
    input_rank = keras_bridge.einsum_dense_input_rank(layer, input_spec, output_spec)
    if input_rank is None:
        raise ValueError(f"Cannot tell the input rank of EinsumDense {layer.name!r}.")
    bias = getattr(layer, "bias", None)
    return EinsumDenseHyperparameters(
        equation=equation,
        bias_axes=None if bias is None else str(layer.bias_axes),
        kernel_shape=tuple(int(s) for s in layer.kernel.shape),
        bias_shape=None if bias is None else tuple(int(s) for s in bias.shape),
        input_rank=input_rank,
        activation=_activation_name(getattr(layer, "activation", None)))


def _activation_name(activation):
    """None for no activation or Keras' linear (what both Keras versions store for None)."""
    name = getattr(activation, "__name__", None) if activation is not None else None
    if activation is not None and name is None:
        name = type(activation).__name__
    return None if name in (None, "linear") else name


@register(keras.layers.EinsumDense)
class EinsumDenseHandler(Handler):
    """EinsumDense with a row-form equation (MultiHeadAttention's included)."""

    name = "einsum_dense"
    summary = ("equations in row form (MultiHeadAttention's projections included): the Dense "
               "row math on the equation's rows; other equations take the generic VJP")
    records_pre_activation = True  # the row math is for the einsum plus bias
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        try:
            hparams = einsum_dense_hyperparameters(layer)
            parse_equation(hparams.equation, hparams.input_rank)  # row form, else generic
            if hparams.bias_axes is not None:
                ones_column_valid(hparams.equation, hparams.bias_axes)  # checks the bias letters
        except ValueError:  # UnsupportedEinsumError included
            return None
        return hparams

    def variables(self, layer, hparams):
        return [layer.kernel] if hparams.bias_axes is None else [layer.kernel, layer.bias]

    def layer_result(self, call, hparams, layout):
        equation, bias_axes = hparams.equation, hparams.bias_axes
        a, g_rows = einsum_rows(equation, call.inputs, call.grad_output)
        d_in, d_out = a.shape[-1], g_rows.shape[-1]
        src = rows.RowSource(a, g_rows, d_in, layout.options)
        path = rows.RowsPath(rows.choose_materialize(src, layout.num_microbatches,
                                                     layout.examples_per_microbatch))
        use_bias = bias_axes is not None
        ones_column = use_bias and ones_column_valid(equation, bias_axes)
        bias_per_microbatch = None
        if use_bias and not ones_column:
            bias_per_microbatch = lambda m: clip.sum_microbatches(
                per_example_bias_grads(equation, bias_axes, call.grad_output), m)
        norms = rows.linear_norms(src, path, layout, kernel_shape=(d_in, d_out),
                                  use_bias=use_bias, bias_per_microbatch=bias_per_microbatch)

        def clipped_sum(weights):
            grads = norms.clipped_sum(weights)
            kernel = kernel_from_matrix(equation, grads[0], hparams.kernel_shape)
            if not use_bias:
                return [kernel]
            bias = grads[1]
            if ones_column:  # kernel column order → bias order
                bias = bias_from_kernel_columns(equation, bias_axes, bias, hparams.kernel_shape)
            return [kernel, tf.reshape(bias, hparams.bias_shape)]

        return LayerResult(norms.sq_norms, clipped_sum, path)
