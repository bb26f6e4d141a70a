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
"""LoRA: Keras 3 Dense and EinsumDense layers after ``layer.enable_lora(rank)``.

Such a layer computes ``y = einsum(eq, x, W) (+ bias)`` with the merged kernel

    W = W₀ + s·A·B,    s = lora_alpha / rank,

W₀ the frozen base kernel, A [*kernel_shape[:-1], r] and B [r, kernel_shape[-1]]
the trainable factors (A·B contracts A's last axis with B's first; a Dense is
``"...i,io->...o"``). With e the kernel's last letter, an output letter (Dense and
every MultiHeadAttention projection), and ρ the rank letter in its place:

* A is the kernel of the same equation with e replaced by ρ, on the input x and the
  output gradient G_A = s·G·Bᵀ (G's e axis contracted with B): rows x_t and
  v_t = s·(G Bᵀ)_t, so ``∂ℓ/∂A = Σ_t x_t v_tᵀ``;
* B is a Dense kernel [r, d_e] on u = s·einsum(eq_ρ, x, A) (the layer's low-rank
  hidden activations, e → ρ) and G, with rows every output position but e:
  ``∂ℓ/∂B = Σ_t u_t g_tᵀ``.

Each factor is then the Dense row math of rows.py (ghost norm
Σ_{t,s}(u_t·u_s)(v_t·v_s) or materialized [d_in, r] / [r, d_e] per-microbatch
gradients, whichever `rows.choose_materialize` picks; book-keeping clipped sum):
no per-example [d_in, d_out] tensor is made. The microbatch's squared norm is the
sum of its factors', the bias's (the output gradient summed over each microbatch's
rows, as in einsum_dense.py) and, if the base kernel was made trainable again, the
plain kernel's. Only the trainable ones count (a factor or the bias frozen with
``variable.trainable = False``): `variables` lists exactly those, and a frozen base
kernel costs nothing.

Declined (the generic per-example VJP, exact): quantized layers, equations without row
form or whose kernel's last letter is contracted, subclasses with a call of their own.

Example (one example, Dense-like rows, against the factor gradients by hand):

>>> import numpy as np
>>> rng = np.random.default_rng(0)
>>> x, g = rng.normal(size=(1, 3, 4)), rng.normal(size=(1, 3, 5))
>>> a, b, s = rng.normal(size=(4, 2)), rng.normal(size=(2, 5)), 0.5
>>> grads = factor_grads("abi,io->abo", x, g, a, b, s)
>>> w_grad = np.einsum("abi,abo->io", x, g)  # the merged kernel's gradient
>>> bool(np.allclose(grads["a"], s * w_grad @ b.T) and np.allclose(grads["b"], s * a.T @ w_grad))
True
"""

import dataclasses
import string
from typing import Any, Tuple

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import Handler, LayerPath, LayerResult
from tf_tempered.privacy.layer_grads.einsum_equation import (einsum_rows, kernel_from_matrix,
                                                             parse_equation)
from tf_tempered.privacy.layer_grads.einsum_dense import ones_column_valid, per_example_bias_grads
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["LoraDenseHandler", "LoraEinsumDenseHandler", "LoraHyperparameters", "LoraPath",
           "factor_grads"]

_DENSE_EQUATION = "...i,io->...o"  # a Dense layer as an EinsumDense, bias_axes "o"


@dataclasses.dataclass(frozen=True)
class LoraHyperparameters:
    """Plain values of a LoRA layer.

    equation: the layer's einsum (a Dense's is "...i,io->...o"); kernel_shape, rank,
    scale (alpha / rank); trains: which of "kernel" (the base), "a", "b", "bias" are
    trainable, in that order; bias_axes / bias_shape: None without a bias;
    dtypes: the trainable variables' dtypes, in the order of `trains`.
    """
    equation: str
    kernel_shape: Tuple[int, ...]
    rank: int
    scale: float
    trains: Tuple[str, ...]
    bias_axes: Any = None
    bias_shape: Any = None
    dtypes: Tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class LoraPath(LayerPath):
    """The paths taken: each trained factor's (and a trained base kernel's) RowsPath."""
    a: Any = None
    b: Any = None
    kernel: Any = None


def _letters(equation, input_rank):
    """(input, kernel, output, e, ρ) of the equation with any ellipsis expanded."""
    form = parse_equation(equation, input_rank)
    rho = next(c for c in string.ascii_letters
               if c not in form.input_spec + form.kernel_spec + form.output_spec)
    return form.input_spec, form.kernel_spec, form.output_spec, form.kernel_spec[-1], rho


def _factor_problems(equation, x, g, a, b, scale):
    """{name: (equation, input, output gradient)}: A and B as kernels of einsum layers, and
    the merged kernel's own (for a trainable base kernel). All without an ellipsis."""
    ins, ker, out, e, rho = _letters(equation, x.shape.rank)
    out_rho = out.replace(e, rho)
    eq_a = f"{ins},{ker.replace(e, rho)}->{out_rho}"
    eq_b = f"{out_rho},{rho}{e}->{out}"
    g_a = scale * tf.einsum(f"{out},{rho}{e}->{out_rho}", g, b)  # s·G·Bᵀ on the e axis
    u = scale * tf.einsum(eq_a, x, a)  # s·(x A): the low-rank activations
    return {"kernel": (f"{ins},{ker}->{out}", x, g), "a": (eq_a, x, g_a), "b": (eq_b, u, g)}


def factor_grads(equation, x, g, a, b, scale):
    """Per-example gradients {"kernel", "a", "b"} (the merged kernel's, A's, B's) of one
    LoRA einsum layer, from its input x and output gradient g: the handler's rows,
    materialized per example (for tests and the docstring)."""
    x, g, a, b = (tf.convert_to_tensor(t) for t in (x, g, a, b))
    out = {}
    for name, (eq, inputs, grad) in _factor_problems(equation, x, g, a, b, scale).items():
        rows_in, rows_g = einsum_rows(eq, inputs, grad)
        shape = {"kernel": (*a.shape[:-1], b.shape[-1]), "a": a.shape, "b": b.shape}[name]
        out[name] = kernel_from_matrix(eq, tf.matmul(rows_in, rows_g, transpose_a=True), shape)
    return out


def _row_norms(eq, inputs, grad, shape, layout):
    """LayerResult of one kernel-like weight of the einsum layer `eq` (no bias)."""
    rows_in, rows_g = einsum_rows(eq, inputs, grad)
    src = rows.RowSource(rows_in, rows_g, rows_in.shape[-1], layout.options)
    path = rows.RowsPath(rows.choose_materialize(src, layout.num_microbatches,
                                                 layout.examples_per_microbatch))
    norms = rows.linear_norms(src, path, layout, kernel_shape=(rows_in.shape[-1],
                                                             rows_g.shape[-1]), use_bias=False)
    return LayerResult(norms.sq_norms,
                       lambda w: [kernel_from_matrix(eq, norms.clipped_sum(w)[0], shape)], path)


def _bias_norms(hparams, g, layout):
    """LayerResult of the bias: the output gradient summed over each microbatch's rows."""
    form = parse_equation(hparams.equation, output_rank=g.shape.rank)
    equation = f"{form.input_spec},{form.kernel_spec}->{form.output_spec}"
    per_microbatch = clip.sum_microbatches(
        per_example_bias_grads(equation, hparams.bias_axes, g), layout.num_microbatches)
    return LayerResult(tf.reduce_sum(tf.square(per_microbatch), 1),
                       lambda w: [tf.reshape(clip.weighted_sum(
                           w.zero_nonfinite(per_microbatch), w.scale), hparams.bias_shape)])


def _lora_hyperparameters(layer, equation, bias_axes):
    """LoraHyperparameters of a LoRA layer (None if not, or if the handler does not cover it)."""
    factors = keras_bridge.lora_factors(layer)
    if factors is None or not layer.trainable:
        return None
    base, a, b, scale = factors
    bias = getattr(layer, "bias", None)
    try:
        form = parse_equation(equation)
        if bias is not None:
            ones_column_valid(equation, bias_axes)  # checks the bias letters
    except ValueError:  # no row form (UnsupportedEinsumError), or a bias it cannot place
        return None
    if form.kernel_spec[-1] not in form.d_out:  # B would act on a contracted axis
        return None
    candidates = (("kernel", base), ("a", a), ("b", b), ("bias", bias))
    trained = [(name, v) for name, v in candidates if v is not None and v.trainable]
    if not trained:
        return None
    return LoraHyperparameters(
        equation=equation, kernel_shape=keras_bridge.shape_of(base), rank=int(a.shape[-1]),
        scale=scale, trains=tuple(name for name, _ in trained),
        bias_axes=bias_axes if bias is not None else None,
        bias_shape=keras_bridge.shape_of(bias) if bias is not None else None,
        dtypes=tuple(tf.as_dtype(v.dtype).name for _, v in trained))


class _LoraHandler(Handler):
    """The LoRA factors (and a trainable bias or base kernel) by the Dense row math."""

    records_pre_activation = True  # the row math is for the einsum plus bias

    def layer_equation(self, layer):
        """(equation, bias_axes) of the layer as an EinsumDense."""
        raise NotImplementedError

    def hyperparameters(self, layer):
        return _lora_hyperparameters(layer, *self.layer_equation(layer))

    def variables(self, layer, hparams):
        base, a, b, _ = keras_bridge.lora_factors(layer)
        named = {"kernel": base, "a": a, "b": b, "bias": getattr(layer, "bias", None)}
        return [named[name] for name in hparams.trains]

    def layer_result(self, call, hparams, layout):
        g = clip.widen(tf.convert_to_tensor(call.grad_output))
        x = tf.cast(call.inputs, g.dtype)
        _, a, b, _ = keras_bridge.lora_factors(call.layer)
        a, b = (tf.cast(tf.convert_to_tensor(keras_bridge.watchable(v)), g.dtype)
                for v in (a, b))
        problems = _factor_problems(hparams.equation, x, g, a, b, hparams.scale)
        shapes = {"kernel": hparams.kernel_shape, "a": tuple(a.shape), "b": tuple(b.shape)}
        parts = [_row_norms(*problems[name], shapes[name], layout) if name != "bias"
                 else _bias_norms(hparams, g, layout) for name in hparams.trains]
        sq = tf.add_n([part.sq_norms for part in parts])
        paths = {name: part.path for name, part in zip(hparams.trains, parts) if name != "bias"}

        def clipped_sum(weights):
            return [tf.cast(part.clipped_sum(weights)[0], dtype)
                    for part, dtype in zip(parts, hparams.dtypes)]

        return LayerResult(sq, clipped_sum, LoraPath(**paths))


@register(keras.layers.Dense)
class LoraDenseHandler(_LoraHandler):
    """A Dense layer with LoRA enabled (Keras 3)."""

    name = "lora_dense"
    summary = ("Keras 3 LoRA (`enable_lora`; not quantized): the factors A and B as Dense row "
               "products (input rows and s·G·Bᵀ; s·x·A and G), ghost norm or materialized "
               "[d_in, r] / [r, d_out] per-microbatch gradients; bias as Dense; a frozen base "
               "kernel costs nothing; book-keeping clipped sum")

    def layer_equation(self, layer):
        return _DENSE_EQUATION, "o"


@register(keras.layers.EinsumDense)
class LoraEinsumDenseHandler(_LoraHandler):
    """An EinsumDense layer with LoRA enabled (Keras 3), row-form equations."""

    name = "lora_einsum_dense"
    summary = ("Keras 3 LoRA (`enable_lora`; not quantized) on row-form equations whose "
               "kernel's last letter is an output letter (MultiHeadAttention's projections "
               "included): as `lora_dense` on the equation's rows")

    def layer_equation(self, layer):
        return str(layer.equation), (None if layer.bias is None else str(layer.bias_axes))
