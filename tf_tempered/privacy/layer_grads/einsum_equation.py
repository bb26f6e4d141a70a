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
"""EinsumDense equations in row form: parsing, the rows of x and G, the kernel from a matrix.

An ``EinsumDense(equation, output_shape, bias_axes)`` layer computes
``y = einsum(equation, x, kernel) (+ bias)``. When its equation has *row form*,
each letter of ``"<input>,<kernel>-><output>"`` is one of

* the batch letter: the first input letter; it must lead the output and not be
  in the kernel (examples must not mix and must not share a kernel slice);
* a *row* letter: in the input and the output, not in the kernel (sequence
  positions, the other axes an ellipsis stands for, ...);
* a *contracted* letter → d_in: in the input and the kernel, not the output;
* an *output* letter → d_out: in the kernel and the output, not the input;
* a *summed* letter: only in the input; it is summed out of x first, because
  Σ_c (Σ_s x[.., s, c]) K[c, ..] is the same layer with a smaller input.

Then, writing a_r for x's contracted axes flattened at row r (r runs over the
row letters, the batch letter fixed) and g_r for the output gradient's d_out axes
there, the layer is a Dense layer on rows, y_r = Kᵀ a_r (+ bias), and one
example's kernel gradient, as a d_in × d_out matrix, is

    ∂ℓ/∂K = Σ_r a_r g_rᵀ,            ‖∂ℓ/∂K‖² = Σ_{r,s} (a_r·a_s)(g_r·g_s),

exactly the Dense math of layer_grads/rows.py (ghost norm, materialization, book-keeping),
on a [B, R, d_in] and g [B, R, d_out] from :func:`einsum_rows`; the matrix goes
back to the kernel's shape and axis order with :func:`kernel_from_matrix`.

Not row form, refused with :class:`UnsupportedEinsumError` (a ValueError and an
``UnsupportedLayerError``) so that the caller can use the generic per-example
fallback: a letter in the input, the kernel *and* the output (a per-position
kernel, e.g. ``abc,bcd->abd``: the gradient is no single sum of outer products),
a kernel-only letter (summed away), the batch letter in the kernel or not leading
the output, a repeated letter in one operand (diagonals), an ellipsis in the
kernel.

Everything here takes plain strings, shapes and tensors, so the math does not
depend on the Keras version; the bias and the layer's hyperparameters are in
einsum_dense.py.

Every EinsumDense inside ``MultiHeadAttention`` has row form (checked on
tf-keras 2.21 and Keras 3.15, which build the same equations):

* query / key / value: ``abc,cde->abde``, bias_axes ``de``: rows b, d_in c, d_out de;
* output: ``abcd,cde->abe``, bias_axes ``e``: rows b, d_in cd, d_out e;
* with ``attention_axes=(1, 2)``: q/k/v ``abcd,def->abcef`` (``ef``; rows bc, d_in d,
  d_out ef) and output ``abcde,def->abcf`` (``f``; rows bc, d_in de, d_out f).

In all of them the bias axes are exactly the d_out letters, so the ones-column
trick is valid (:func:`ones_column_valid`).

Example (one example's kernel gradient of a query projection, against einsum):

>>> import numpy as np
>>> form = parse_equation("abc,cde->abde")
>>> form.batch, form.rows, form.d_in, form.d_out
('a', 'b', 'c', 'de')
>>> rng = np.random.default_rng(0)
>>> x, g = rng.normal(size=(2, 5, 3)), rng.normal(size=(2, 5, 2, 4))
>>> a, g_rows = einsum_rows("abc,cde->abde", x, g)
>>> tuple(a.shape), tuple(g_rows.shape)
((2, 5, 3), (2, 5, 8))
>>> per_example = kernel_from_matrix("abc,cde->abde", tf.matmul(a, g_rows, transpose_a=True),
...                                  kernel_shape=(3, 2, 4))
>>> bool(np.allclose(per_example, np.einsum("abc,abde->acde", x, g)))
True
>>> ghost = tf.reduce_sum(tf.matmul(a, a, transpose_b=True)
...                       * tf.matmul(g_rows, g_rows, transpose_b=True), [1, 2])
>>> bool(np.allclose(ghost, np.sum(np.square(per_example), axis=(1, 2, 3))))
True
"""

import dataclasses
import string

import numpy as np

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import UnsupportedEinsumError

__all__ = ["EinsumRowForm", "axis_size", "einsum_rows", "kernel_from_matrix", "parse_equation",
           "refusal", "row_widths", "size_product", "split_operands", "to_rows"]


@dataclasses.dataclass(frozen=True)
class EinsumRowForm:
    """An EinsumDense equation classified into rows (all letters, ellipsis expanded).

    equation: as given; input_spec, kernel_spec, output_spec: the operands with
    any ``...`` replaced by the letters in ``ellipsis``; batch: the batch letter;
    rows: row letters in input order; d_in: contracted letters in kernel order;
    d_out: output letters in kernel order; summed: input-only letters.
    """
    equation: str
    input_spec: str
    kernel_spec: str
    output_spec: str
    batch: str
    rows: str
    d_in: str
    d_out: str
    summed: str
    ellipsis: str


def refusal(equation, why):
    return UnsupportedEinsumError(
        f"EinsumDense equation {equation!r} is not in row form ({why}); its per-example "
        "gradients need the generic per-example fallback.")


def split_operands(equation):
    """(input, kernel, output) operand strings, with '...' kept; checks the syntax."""
    specs = keras_bridge.einsum_operands(equation)
    if specs is None:
        raise refusal(equation, "expected '<input>,<kernel>-><output>'")
    for spec in specs:
        letters = spec.replace("...", "", 1)
        if not letters.isalpha() and letters:
            raise refusal(equation, f"operand {spec!r} is not letters with at most one '...'")
        if not letters.isascii() or len(set(letters)) != len(letters):
            raise refusal(equation, f"operand {spec!r} repeats a letter or has non-ASCII ones")
    if "..." in specs[1]:
        raise refusal(equation, "an ellipsis in the kernel")
    if ("..." in specs[0]) != ("..." in specs[2]):
        raise refusal(equation, "an ellipsis in only one of input and output")
    return specs


def parse_equation(equation, input_rank=None, *, output_rank=None):
    """Classifies an EinsumDense equation into rows; raises UnsupportedEinsumError if not row form.

    Args:
        equation: ``"<input>,<kernel>-><output>"`` as EinsumDense takes it, possibly
            with one ``...`` in the input and the output (``"...b,bc->...c"``,
            ``"ab...,bc->ac..."``).
        input_rank: rank of the layer's input (or give ``output_rank``); only used
            to expand an ellipsis. Without either, an ellipsis stands for the fewest
            axes the equation allows: one (the batch axis) when it leads the input,
            else none. That changes only the row letters, never d_in, d_out or the
            bias layout's letters.

    Returns:
        An :class:`EinsumRowForm` of plain strings.
    """
    input_spec, kernel_spec, output_spec = split_operands(equation)
    named_in = input_spec.replace("...", "")
    named_out = output_spec.replace("...", "")
    if "..." in input_spec:
        if input_rank is not None:
            count = input_rank - len(named_in)
        elif output_rank is not None:
            count = output_rank - len(named_out)
        else:
            count = 1 if input_spec.startswith("...") else 0
        if count < 0:
            raise ValueError(f"EinsumDense equation {equation!r} has more input letters "
                             f"than the input has axes (rank {input_rank}).")
        used = set(named_in + kernel_spec + named_out)
        ellipsis = "".join([c for c in string.ascii_letters if c not in used][:count])
        input_spec = input_spec.replace("...", ellipsis)
        output_spec = output_spec.replace("...", ellipsis)
    else:
        ellipsis = ""
    for rank, spec, name in ((input_rank, input_spec, "input"),
                             (output_rank, output_spec, "output")):
        if rank is not None and rank != len(spec):
            raise ValueError(f"EinsumDense equation {equation!r} does not fit an {name} "
                             f"of rank {rank}.")
    if not input_spec:
        raise refusal(equation, "the input has no batch axis")
    batch = input_spec[0]
    if batch in kernel_spec:
        raise refusal(equation, f"the batch letter {batch!r} is in the kernel")
    if not output_spec.startswith(batch):
        raise refusal(equation, f"the batch letter {batch!r} does not lead the output")
    for letter in kernel_spec:
        if letter in input_spec and letter in output_spec:
            raise refusal(equation, f"{letter!r} is in the input, the kernel and the output "
                                    "(a per-position kernel)")
        if letter not in input_spec and letter not in output_spec:
            raise refusal(equation, f"kernel letter {letter!r} is summed away")
    for letter in output_spec:
        if letter not in input_spec and letter not in kernel_spec:
            raise refusal(equation, f"output letter {letter!r} is in neither operand")
    return EinsumRowForm(
        equation=equation, input_spec=input_spec, kernel_spec=kernel_spec,
        output_spec=output_spec, batch=batch,
        rows="".join(c for c in input_spec[1:] if c in output_spec),
        d_in="".join(c for c in kernel_spec if c in input_spec),
        d_out="".join(c for c in kernel_spec if c in output_spec),
        summed="".join(c for c in input_spec if c not in kernel_spec and c not in output_spec),
        ellipsis=ellipsis)


def axis_size(t, axis):
    """A static int if known, else a scalar tensor."""
    static = t.shape[axis]
    return static if static is not None else tf.shape(t)[axis]


def size_product(sizes):
    if all(isinstance(s, int) for s in sizes):
        return int(np.prod(sizes, dtype=np.int64))
    return tf.reduce_prod(tf.stack([tf.cast(s, tf.int32) for s in sizes]))


def to_rows(t, spec, batch, rows, columns):
    """t (axes named by `spec`) → [B, ∏ rows, ∏ columns], axes ordered batch + rows + columns.

    One transpose (skipped when the axes are already in that order, as for MHA's
    projections) and one reshape. a and g must flatten their rows in the same
    order, so both are called with the same `rows` string.
    """
    perm = [spec.index(c) for c in batch + rows + columns]
    if perm != list(range(len(perm))):
        t = tf.transpose(t, perm)
    sizes = [axis_size(t, i) for i in range(len(perm))]
    row_count = size_product(sizes[1:1 + len(rows)])
    column_count = size_product(sizes[1 + len(rows):])
    if not isinstance(row_count, int):
        row_count = -1  # the one unknown size tf.reshape may infer
    return tf.reshape(t, [sizes[0], row_count, column_count])


def einsum_rows(equation, x, g):
    """(a [B, R, d_in], g_rows [B, R, d_out]): an EinsumDense's input and output gradient as rows.

    x is the layer's input (axes as the equation's input operand), g the gradient
    of the loss with respect to its output before any activation (the einsum
    plus bias: adding the bias does not change the gradient; an activation
    would, so a layer with one must be recorded before it, as Dense layers are).
    Row r of example b pairs a[b, r] with g_rows[b, r], and
    ``matmul(a, g_rows, transpose_a=True)[b]`` is example b's kernel gradient as a
    d_in × d_out matrix (:func:`kernel_from_matrix` gives the kernel's layout).
    Input-only letters are summed out of x first. Raises UnsupportedEinsumError
    unless the equation has row form (see the module docstring).
    """
    x, g = tf.convert_to_tensor(x), tf.convert_to_tensor(g)
    form = parse_equation(equation, x.shape.rank, output_rank=g.shape.rank)
    input_spec = form.input_spec
    if form.summed:
        x = tf.reduce_sum(x, [input_spec.index(c) for c in form.summed])
        input_spec = "".join(c for c in input_spec if c not in form.summed)
    return (to_rows(x, input_spec, form.batch, form.rows, form.d_in),
            to_rows(g, form.output_spec, form.batch, form.rows, form.d_out))


def row_widths(equation, kernel_shape):
    """(d_in, d_out): the widths of a and g rows (e.g. to weigh ghost norm vs materializing)."""
    form = parse_equation(equation)
    size = dict(zip(form.kernel_spec, [int(s) for s in kernel_shape]))
    return (size_product([size[c] for c in form.d_in]), size_product([size[c] for c in form.d_out]))


def kernel_from_matrix(equation, matrix, kernel_shape, *, flat=False):
    """Maps kernel gradients in row layout back to the kernel's shape and axis order.

    matrix: [..., d_in, d_out] (e.g. Σ_r a_r g_rᵀ per example or per microbatch),
    or [..., d_in·d_out] with ``flat=True`` (rows.py's materialized layout);
    d_in and d_out flatten the contracted and output letters in kernel order, as
    :func:`einsum_rows` does. Returns [..., *kernel_shape]. The kernel's letters
    need not come contracted-first (``"abc,dc->abd"``): the axes are transposed.
    """
    form = parse_equation(equation)
    kernel_shape = [int(s) for s in kernel_shape]
    if len(kernel_shape) != len(form.kernel_spec):
        raise ValueError(f"kernel_shape {kernel_shape} does not match the kernel "
                         f"{form.kernel_spec!r} of {equation!r}.")
    size = dict(zip(form.kernel_spec, kernel_shape))
    matrix = tf.convert_to_tensor(matrix)
    lead = matrix.shape.rank - (1 if flat else 2)
    letters = form.d_in + form.d_out
    if lead < 0:
        raise ValueError(f"matrix of rank {matrix.shape.rank} has no d_in/d_out axes.")
    lead_shape = [axis_size(matrix, i) for i in range(lead)]
    t = tf.reshape(matrix, lead_shape + [size[c] for c in letters])
    perm = list(range(lead)) + [lead + letters.index(c) for c in form.kernel_spec]
    if perm != list(range(len(perm))):
        t = tf.transpose(t, perm)
    return t

