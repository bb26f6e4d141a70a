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
"""The EinsumDense handler: the Dense row math (rows.py) on einsum_dense.py's rows.

With a row-form equation (einsum_dense.py), an EinsumDense is a Dense layer on
rows a [B, R, d_in] and g [B, R, d_out]: ghost norm or materialized gradients
and the book-keeping sum come from rows.py, and the kernel gradient goes back
to the kernel's layout with kernel_from_matrix. The bias rides in the ghost
norm as a column of ones where that is valid (every MultiHeadAttention
projection), else it is summed per example (per_example_bias_grads).
Equations without row form, and LoRA/quantized layers, take the generic path.
"""

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import clip
from tf_tempered.privacy.layer_grads import Handler, Norms, register, rows
from tf_tempered.privacy.layer_grads import einsum_dense as ed

__all__ = ["EinsumDenseHandler"]


@register(keras.layers.EinsumDense)
class EinsumDenseHandler(Handler):
    """EinsumDense with a row-form equation (MultiHeadAttention's included)."""

    name = "einsum_dense"
    summary = ("equations in row form (MultiHeadAttention's projections included): the Dense "
               "row math on the equation's rows; other equations take the generic VJP")
    records_pre_activation = True  # the row math is for the einsum plus bias

    def hyperparameters(self, layer):
        try:
            params = ed.einsum_dense_hyperparameters(layer)
            ed.parse_equation(params.equation, params.input_rank)  # row form, else generic
            if params.bias_axes is not None:
                ed.ones_column_valid(params.equation, params.bias_axes)  # checks the bias letters
        except ValueError:  # UnsupportedEinsumError included
            return None
        return params

    def variables(self, layer, params):
        return [layer.kernel] if params.bias_axes is None else [layer.kernel, layer.bias]

    def norms(self, call, params, step):
        equation, bias_axes = params.equation, params.bias_axes
        a, g_rows = ed.einsum_rows(equation, call.inputs, call.grad_output)
        d_in, d_out = a.shape[-1], g_rows.shape[-1]
        src = rows.RowSource(a, g_rows, d_in, step.options)
        path = rows.RowsPath(rows.choose_materialize(src, step.num_microbatches,
                                                     step.examples_per_microbatch))
        use_bias = bias_axes is not None
        ones_column = use_bias and ed.ones_column_valid(equation, bias_axes)
        bias_per_microbatch = None
        if use_bias and not ones_column:
            bias_per_microbatch = lambda m: clip.sum_microbatches(
                ed.per_example_bias_grads(equation, bias_axes, call.grad_output), m)
        norms = rows.linear_norms(src, path, step, kernel_shape=(d_in, d_out),
                                  use_bias=use_bias, bias_per_microbatch=bias_per_microbatch)

        def clipped_sum(weights):
            grads = norms.clipped_sum(weights)
            kernel = ed.kernel_from_matrix(equation, grads[0], params.kernel_shape)
            if not use_bias:
                return [kernel]
            bias = grads[1]
            if ones_column:  # kernel column order → bias order
                bias = ed.bias_from_kernel_columns(equation, bias_axes, bias, params.kernel_shape)
            return [kernel, tf.reshape(bias, params.bias_shape)]

        return Norms(norms.sq_norms, clipped_sum, path)
