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
"""EinsumDense → Dense rows (layer_grads/einsum_dense.py) against per-example tapes.

Every check is float64 against `tf.GradientTape` on real EinsumDense layers
(tf-keras here; Keras 3 in a subprocess at the end): the rows' Σ_r a_r g_rᵀ mapped
back to the kernel layout, the bias gradients, the ghost norm
Σ_{r,s}(a_r·a_s)(g_r·g_s) (a local reference) and its ones-column variant, per
example and per microbatch, and the EinsumDense layers inside MultiHeadAttention.
"""

import doctest
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from once_per_session import once_per_session

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import errors
from tf_tempered.privacy.layer_grads import einsum_dense as ed
from tf_tempered.privacy.layer_grads import einsum_equation
from tf_tempered.privacy.layer_grads import einsum_equation as eq

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH = 4
TOL = dict(rtol=1e-11, atol=1e-11)

# (equation, output_shape, bias_axes, input shape without the batch axis)
CASES = [
    ("ab,bc->ac", 4, "c", (3,)),                                  # Dense
    ("abc,cd->abd", (None, 4), None, (5, 3)),                     # sequence Dense
    ("abc,cd->abd", (None, 4), "d", (5, 3)),                      # ... with bias
    ("abc,cde->abde", (None, 2, 4), "de", (5, 3)),                # MHA q/k/v
    ("abc,cde->abde", (None, 2, 4), "e", (5, 3)),                 # bias over part of d_out
    ("abc,cde->abde", (None, 2, 4), "ed", (5, 3)),                # bias_axes not in output order
    ("abcd,de->abce", (5, 3, 2), "ce", (5, 3, 4)),                # bias over a row axis and d_out
    ("abcd,cde->abe", (None, 6), "e", (5, 2, 4)),                 # MHA output
    ("abcd,def->abcef", (None, None, 2, 4), "ef", (3, 5, 6)),     # MHA q/k/v, 2 attention axes
    ("abcde,def->abcf", (None, None, 6), "f", (3, 5, 2, 4)),      # MHA output, 2 attention axes
    ("...b,bc->...c", 4, "c", (5, 3)),                            # left ellipsis: batch + rows
    ("...b,bc->...c", 4, "c", (3,)),                              # left ellipsis: batch only
    ("ab...,bc->ac...", 4, "c", (3, 5)),                          # right ellipsis: trailing rows
    ("abc,dc->abd", (None, 4), "d", (5, 3)),                      # kernel output-first
    ("abc,cd->adb", (4, 5), "d", (5, 3)),                         # rows move in the output
    ("abc,cd->ad", 4, "d", (5, 3)),                               # input-only letter summed
    ("abc,cd->abd", (5, 4), "bd", (5, 3)),                        # per-position bias
    ("abcd,dce->abe", (None, 6), "e", (5, 2, 4)),                 # kernel order ≠ input
]
CASE_IDS = [f"{eq}|{bias}|{shape}" for eq, _, bias, shape in CASES]


def _layer(equation, output_shape, bias_axes, input_shape, seed=0):
    layer = keras.layers.EinsumDense(
        equation, output_shape=output_shape, bias_axes=bias_axes, dtype="float64",
        kernel_initializer=keras.initializers.RandomNormal(seed=seed),
        bias_initializer=keras.initializers.RandomNormal(seed=seed + 1))
    layer.build((None,) + tuple(input_shape))
    return layer


def _variables(layer):
    return [layer.kernel] + ([layer.bias] if layer.bias is not None else [])


def _tape_per_example(layer, x, g):
    """[per-example kernel grads [B, *kernel], per-example bias grads [B, *bias]] by tapes."""
    grads = []
    for b in range(x.shape[0]):
        with tf.GradientTape() as tape:
            y = layer(x[b:b + 1])
        grads.append(tape.gradient(y, _variables(layer), output_gradients=g[b:b + 1]))
    return [np.stack([gr[i].numpy() for gr in grads]) for i in range(len(grads[0]))]


def _ghost(a, g, ones=False):
    """Local reference: Σ_{r,s} (a_r·a_s [+ 1])(g_r·g_s) for each leading index."""
    a, g = np.asarray(a), np.asarray(g)
    a_gram = np.einsum("mri,msi->mrs", a, a) + (1.0 if ones else 0.0)
    return np.einsum("mrs,mrs->m", a_gram, np.einsum("mri,msi->mrs", g, g))


def _data(layer, input_shape, seed):
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(BATCH,) + tuple(input_shape)))
    y = layer(x)
    g = tf.constant(rng.normal(size=y.shape))
    return x, g


@pytest.mark.parametrize("equation,output_shape,bias_axes,input_shape", CASES, ids=CASE_IDS)
def test_rows_equal_per_example_tapes(equation, output_shape, bias_axes, input_shape):
    layer = _layer(equation, output_shape, bias_axes, input_shape)
    x, g = _data(layer, input_shape, seed=sum(map(ord, equation + str(bias_axes))))
    tape_grads = _tape_per_example(layer, x, g)
    hyper = ed.einsum_dense_hyperparameters(layer)
    assert hyper.equation == equation and hyper.bias_axes == bias_axes
    assert hyper.kernel_shape == tuple(layer.kernel.shape)
    assert hyper.input_rank == 1 + len(input_shape)
    assert hyper.activation is None
    form = eq.parse_equation(hyper.equation, hyper.input_rank)

    a, g_rows = eq.einsum_rows(equation, x, g)
    d_in = int(np.prod([hyper.kernel_shape[form.kernel_spec.index(c)] for c in form.d_in]))
    d_out = int(np.prod([hyper.kernel_shape[form.kernel_spec.index(c)] for c in form.d_out]))
    assert a.shape[0] == g_rows.shape[0] == BATCH and a.shape[1] == g_rows.shape[1]
    assert (a.shape[2], g_rows.shape[2]) == (d_in, d_out)
    assert eq.row_widths(equation, hyper.kernel_shape) == (d_in, d_out)

    # Σ_r a_r g_rᵀ per example, mapped back, is the tape's kernel gradient.
    matrix = tf.matmul(a, g_rows, transpose_a=True)
    kernel = eq.kernel_from_matrix(equation, matrix, hyper.kernel_shape)
    np.testing.assert_allclose(kernel.numpy(), tape_grads[0], **TOL)
    flat = eq.kernel_from_matrix(equation, tf.reshape(matrix, [BATCH, -1]),
                                 hyper.kernel_shape, flat=True)
    np.testing.assert_allclose(flat.numpy(), tape_grads[0], **TOL)

    # Ghost norm from rows = the per-example squared kernel norm.
    kernel_sq = np.sum(np.square(tape_grads[0]).reshape(BATCH, -1), 1)
    np.testing.assert_allclose(_ghost(a, g_rows), kernel_sq, **TOL)

    # Per microbatch (2 of 2 examples): rows grouped as clip.group_rows does.
    microbatches = BATCH // 2
    grouped_a = tf.reshape(a, [microbatches, -1, a.shape[-1]])
    grouped_g = tf.reshape(g_rows, [microbatches, -1, g_rows.shape[-1]])
    per_microbatch = tape_grads[0].reshape((microbatches, 2) + tape_grads[0].shape[1:]).sum(1)
    np.testing.assert_allclose(_ghost(grouped_a, grouped_g),
                               np.sum(np.square(per_microbatch).reshape(microbatches, -1), 1),
                               **TOL)
    np.testing.assert_allclose(
        eq.kernel_from_matrix(equation, tf.matmul(grouped_a, grouped_g, transpose_a=True),
                              hyper.kernel_shape).numpy(), per_microbatch, **TOL)

    if bias_axes is None:
        assert hyper.bias_shape is None
        return
    assert hyper.bias_shape == tuple(layer.bias.shape)
    assert ed.bias_variable_shape(equation, bias_axes, layer(x).shape) == hyper.bias_shape
    bias = ed.per_example_bias_grads(equation, bias_axes, g, flat=False)
    np.testing.assert_allclose(bias.numpy(), tape_grads[1], **TOL)
    bias_flat = ed.per_example_bias_grads(equation, bias_axes, g)
    np.testing.assert_allclose(bias_flat.numpy(), tape_grads[1].reshape(BATCH, -1), **TOL)
    b_rows = ed.bias_rows(equation, bias_axes, g)
    bias_sq = np.sum(np.square(tape_grads[1]).reshape(BATCH, -1), 1)
    np.testing.assert_allclose(_ghost(np.ones(b_rows.shape[:2] + (1,)), b_rows), bias_sq, **TOL)

    # Ones column: kernel + bias squared norms in one ghost norm, exactly when valid.
    with_ones = _ghost(a, g_rows, ones=True)
    if ed.ones_column_valid(equation, bias_axes):
        np.testing.assert_allclose(with_ones, kernel_sq + bias_sq, **TOL)
        from_columns = ed.bias_from_kernel_columns(equation, bias_axes,
                                                   tf.reduce_sum(g_rows, 1), hyper.kernel_shape)
        np.testing.assert_allclose(from_columns.numpy(), bias_flat.numpy(), **TOL)
    else:
        assert not np.allclose(with_ones, kernel_sq + bias_sq)
        with pytest.raises(ValueError, match="not the kernel's output letters"):
            ed.bias_from_kernel_columns(equation, bias_axes, tf.reduce_sum(g_rows, 1),
                                        hyper.kernel_shape)


def test_hyperparameters_name_the_activation():
    layer = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 4), activation="relu")
    layer.build((None, 5, 3))
    hyper = ed.einsum_dense_hyperparameters(layer)
    assert (hyper.activation, hyper.bias_axes, hyper.bias_shape) == ("relu", None, None)
    assert (hyper.kernel_shape, hyper.input_rank) == ((3, 4), 3)


def test_ones_column_validity():
    assert ed.ones_column_valid("ab,bc->ac", "c")
    assert ed.ones_column_valid("abc,cde->abde", "de")
    assert ed.ones_column_valid("abc,cde->abde", "ed")       # order does not matter
    assert ed.ones_column_valid("abc,ced->abde", "de")       # d_out 'ed', bias 'de'
    assert ed.ones_column_valid("abcd,cde->abe", "e")
    assert not ed.ones_column_valid("abc,cde->abde", "e")    # bias sums over rows × d
    assert not ed.ones_column_valid("abc,cd->abd", "bd")     # per-position bias
    assert not ed.ones_column_valid("abc,cd->abd", None)


def test_bias_from_kernel_columns_permutes_to_bias_order():
    # d_out is 'ed' (kernel order), the bias variable is laid out 'de' (output order).
    equation, kernel_shape = "abc,ced->abde", (3, 4, 2)
    layer = _layer(equation, (None, 2, 4), "de", (5, 3))
    assert tuple(layer.kernel.shape) == kernel_shape
    x, g = _data(layer, (5, 3), seed=7)
    _, g_rows = eq.einsum_rows(equation, x, g)
    columns = tf.reduce_sum(g_rows, 1)
    bias = ed.bias_from_kernel_columns(equation, "de", columns, kernel_shape)
    np.testing.assert_allclose(bias.numpy(), _tape_per_example(layer, x, g)[1].reshape(BATCH, -1),
                               **TOL)
    assert not np.allclose(bias.numpy(), columns.numpy())


@pytest.mark.parametrize("equation,why", [
    ("abc,bcd->abd", "per-position kernel"),
    ("abc,cbd->abd", "per-position kernel"),
    ("abc,acd->abd", "batch letter 'a' is in the kernel"),
    ("ab,abc->ac", "batch letter 'a' is in the kernel"),
    ("abc,cde->abd", "summed away"),
    ("abc,cd->bad", "does not lead the output"),
    ("abc,cd->bd", "does not lead the output"),
    ("aab,bc->ac", "repeats a letter"),
    ("abc,cd->abde", "in neither operand"),
    ("...b,...bc->...c", "ellipsis in the kernel"),
    ("abc,cd", "expected"),
])
def test_refused_equations(equation, why):
    with pytest.raises(errors.UnsupportedEinsumError, match=re.escape(equation)) as info:
        eq.parse_equation(equation)
    assert why in str(info.value)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, errors.UnsupportedLayerError)


def test_left_ellipsis_without_a_batch_axis_is_refused():
    with pytest.raises(errors.UnsupportedEinsumError, match="batch letter 'b' is in the kernel"):
        eq.parse_equation("...b,bc->...c", input_rank=1)


def test_refused_real_layers():
    # Per-position kernel and batch-in-kernel layers build in tf-keras, but have no row form.
    for equation, output_shape, input_shape in (("abc,bcd->abd", (5, 4), (5, 3)),
                                                ("abc,acd->abd", (5, 4), (5, 3))):
        layer = keras.layers.EinsumDense(equation, output_shape=output_shape)
        layer.build((BATCH,) + input_shape)
        hyper = ed.einsum_dense_hyperparameters(layer)
        with pytest.raises(errors.UnsupportedEinsumError, match=re.escape(equation)):
            eq.parse_equation(hyper.equation, hyper.input_rank)
        x = tf.zeros((BATCH,) + input_shape)
        with pytest.raises(errors.UnsupportedEinsumError):
            eq.einsum_rows(equation, x, layer(x))


def test_ellipsis_expansion_follows_the_rank():
    assert eq.parse_equation("...b,bc->...c").rows == ""
    form = eq.parse_equation("...b,bc->...c", input_rank=4)
    assert (len(form.rows), form.d_in, form.d_out) == (2, "b", "c")
    assert eq.parse_equation("...b,bc->...c", output_rank=4) == form
    form = eq.parse_equation("ab...,bc->ac...", input_rank=4)
    assert (form.batch, len(form.rows), form.d_in) == ("a", 2, "b")
    with pytest.raises(ValueError, match="does not fit an output of rank 4"):
        eq.parse_equation("abc,cd->abd", input_rank=3, output_rank=3 + 1)


def test_dynamic_batch_and_sequence():
    equation = "abc,cde->abde"
    layer = _layer(equation, (None, 2, 4), "de", (5, 3))
    x, g = _data(layer, (5, 3), seed=3)
    rows = tf.function(lambda x, g: eq.einsum_rows(equation, x, g), input_signature=[
        tf.TensorSpec([None, None, 3], tf.float64), tf.TensorSpec([None, None, 2, 4], tf.float64)])
    a, g_rows = rows(x, g)
    expected = eq.einsum_rows(equation, x, g)
    np.testing.assert_array_equal(a.numpy(), expected[0].numpy())
    np.testing.assert_array_equal(g_rows.numpy(), expected[1].numpy())
    bias = tf.function(lambda g: ed.per_example_bias_grads(equation, "de", g, flat=False),
                       input_signature=[tf.TensorSpec([None, None, 2, 4], tf.float64)])(g)
    np.testing.assert_allclose(bias.numpy(), _tape_per_example(layer, x, g)[1], **TOL)
    kernel = tf.function(lambda m: eq.kernel_from_matrix(equation, m, (3, 2, 4)),
                         input_signature=[tf.TensorSpec([None, 3, 8], tf.float64)])(
        tf.matmul(a, g_rows, transpose_a=True))
    np.testing.assert_allclose(kernel.numpy(), _tape_per_example(layer, x, g)[0], **TOL)


def _einsum_sublayers(mha):
    layers = [mha._query_dense, mha._key_dense, mha._value_dense, mha._output_dense]
    assert all(isinstance(l, keras.layers.EinsumDense) for l in layers)
    found = [l for l in mha._flatten_layers(include_self=False)
             if isinstance(l, keras.layers.EinsumDense)]
    assert {id(l) for l in found} == {id(l) for l in layers}
    return layers


def test_multi_head_attention_projections_end_to_end():
    """Per-example gradients of a whole tf-keras MHA = Σ_r a_r g_rᵀ of each EinsumDense."""
    tf.keras.utils.set_random_seed(0)
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dtype="float64")
    rng = np.random.default_rng(11)
    x = tf.constant(rng.normal(size=(BATCH, 5, 6)))
    weights = tf.constant(rng.normal(size=(BATCH, 5, 6)))
    mha(x, x)
    layers = _einsum_sublayers(mha)

    # Record each projection's input and output (as the engine's forward pass does).
    seen = {}
    for layer in layers:
        def recording_call(inputs, _layer=layer, _call=layer.call, **kwargs):
            outputs = _call(inputs, **kwargs)
            seen[_layer.name] = (inputs, outputs)
            return outputs
        layer.call = recording_call
    try:
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(mha(x, x) * weights)
            outputs = [seen[l.name][1] for l in layers]
        output_grads = tape.gradient(loss, outputs)
    finally:
        for layer in layers:
            del layer.call

    equations = [(l.equation, l.bias_axes) for l in layers]
    assert equations == [("abc,cde->abde", "de")] * 3 + [("abcd,cde->abe", "e")]
    for layer, g in zip(layers, output_grads):
        hyper = ed.einsum_dense_hyperparameters(layer)
        form = eq.parse_equation(hyper.equation, hyper.input_rank)
        assert form.batch == "a" and ed.ones_column_valid(hyper.equation, hyper.bias_axes)
        inputs = seen[layer.name][0]
        # Per-example references: a tape over the whole attention layer per example.
        references = []
        for b in range(BATCH):
            with tf.GradientTape() as tape:
                loss_b = tf.reduce_sum(mha(x[b:b + 1], x[b:b + 1]) * weights[b:b + 1])
            references.append(tape.gradient(loss_b, _variables(layer)))
        ref_kernel = np.stack([r[0].numpy() for r in references])
        ref_bias = np.stack([r[1].numpy() for r in references])
        a, g_rows = eq.einsum_rows(hyper.equation, inputs, g)
        kernel = eq.kernel_from_matrix(hyper.equation, tf.matmul(a, g_rows, transpose_a=True),
                                       hyper.kernel_shape)
        np.testing.assert_allclose(kernel.numpy(), ref_kernel, **TOL)
        bias = ed.per_example_bias_grads(hyper.equation, hyper.bias_axes, g, flat=False)
        np.testing.assert_allclose(bias.numpy(), ref_bias, **TOL)
        kernel_sq = np.sum(np.square(ref_kernel).reshape(BATCH, -1), 1)
        bias_sq = np.sum(np.square(ref_bias).reshape(BATCH, -1), 1)
        np.testing.assert_allclose(_ghost(a, g_rows), kernel_sq, **TOL)
        np.testing.assert_allclose(_ghost(a, g_rows, ones=True), kernel_sq + bias_sq, **TOL)


def test_multi_head_attention_sublayers_against_their_own_tapes():
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3, output_shape=5,
                                          dtype="float64")
    rng = np.random.default_rng(12)
    query, value = rng.normal(size=(BATCH, 5, 6)), rng.normal(size=(BATCH, 7, 6))
    mha(query, value)
    for layer in _einsum_sublayers(mha):
        hyper = ed.einsum_dense_hyperparameters(layer)
        form = eq.parse_equation(hyper.equation, hyper.input_rank)
        size = dict(zip(form.kernel_spec, hyper.kernel_shape))
        shape = [BATCH] + [size.get(c, 7) for c in form.input_spec[1:]]
        x = tf.constant(rng.normal(size=shape))
        g = tf.constant(rng.normal(size=layer(x).shape))
        tape_grads = _tape_per_example(layer, x, g)
        a, g_rows = eq.einsum_rows(hyper.equation, x, g)
        kernel = eq.kernel_from_matrix(hyper.equation, tf.matmul(a, g_rows, transpose_a=True),
                                       hyper.kernel_shape)
        np.testing.assert_allclose(kernel.numpy(), tape_grads[0], **TOL)
        np.testing.assert_allclose(
            ed.per_example_bias_grads(hyper.equation, hyper.bias_axes, g, flat=False).numpy(),
            tape_grads[1], **TOL)


def test_doctests():
    # The row-form example lives with the equation code (einsum_dense re-exports it).
    result = doctest.testmod(einsum_equation, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# ---------------------------------------------------------------------------
# Keras 3: the same reduction on Keras 3 layers, in a process where Keras 3 is
# imported first (this one has tf-keras bound to tf.keras).

KERAS3_CHILD = r'''
import json
import numpy as np
import keras  # Keras 3
import tensorflow as tf
from tf_tempered.privacy import errors
from tf_tempered.privacy.layer_grads import einsum_dense as ed
from tf_tempered.privacy.layer_grads import einsum_equation as eq

cases = json.loads(__import__("sys").argv[1])
out = {"keras_version": keras.__version__, "backend": keras.backend.backend(),
       "module": keras.layers.EinsumDense.__module__, "cases": {}, "mha": []}
rng = np.random.default_rng(0)


def check(layer, x, g):
    grads = []
    for b in range(x.shape[0]):
        with tf.GradientTape() as tape:
            y = layer(x[b:b + 1])
        variables = [layer.kernel] + ([layer.bias] if layer.bias is not None else [])
        grads.append([np.asarray(t) for t in
                      tape.gradient(y, variables, output_gradients=g[b:b + 1])])
    hyper = ed.einsum_dense_hyperparameters(layer)
    form = eq.parse_equation(hyper.equation, hyper.input_rank)
    a, g_rows = eq.einsum_rows(hyper.equation, x, g)
    kernel = eq.kernel_from_matrix(hyper.equation, tf.matmul(a, g_rows, transpose_a=True),
                                   hyper.kernel_shape).numpy()
    err = float(np.max(np.abs(kernel - np.stack([gr[0] for gr in grads]))))
    if hyper.bias_axes:
        bias = ed.per_example_bias_grads(hyper.equation, hyper.bias_axes, g, flat=False).numpy()
        err = max(err, float(np.max(np.abs(bias - np.stack([gr[1] for gr in grads])))))
        shape = ed.bias_variable_shape(hyper.equation, hyper.bias_axes, layer(x).shape)
        assert shape == hyper.bias_shape
    return {"equation": hyper.equation, "bias_axes": hyper.bias_axes,
            "kernel_shape": list(hyper.kernel_shape), "input_rank": hyper.input_rank,
            "rows": form.rows, "d_in": form.d_in, "d_out": form.d_out,
            "ones": ed.ones_column_valid(hyper.equation, hyper.bias_axes), "max_error": err,
            "activation": hyper.activation}


for equation, output_shape, bias_axes, input_shape in cases:
    layer = keras.layers.EinsumDense(equation, output_shape=output_shape, bias_axes=bias_axes,
                                     dtype="float64", bias_initializer="random_normal")
    x = tf.constant(rng.normal(size=(3,) + tuple(input_shape)))
    layer.build(x.shape)
    g = tf.constant(rng.normal(size=layer(x).shape))
    out["cases"][f"{equation}|{bias_axes}|{tuple(input_shape)}"] = check(layer, x, g)

mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dtype="float64")
x = tf.constant(rng.normal(size=(3, 5, 6)))
mha(x, x)
for name in ("_query_dense", "_key_dense", "_value_dense", "_output_dense"):
    layer = getattr(mha, name)
    hyper = ed.einsum_dense_hyperparameters(layer)
    form = eq.parse_equation(hyper.equation, hyper.input_rank)
    size = dict(zip(form.kernel_spec, hyper.kernel_shape))
    xs = tf.constant(rng.normal(size=[3] + [size.get(c, 5) for c in form.input_spec[1:]]))
    g = tf.constant(rng.normal(size=layer(xs).shape))
    out["mha"].append(dict(check(layer, xs, g), name=name))

lora = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 4), lora_rank=2)
lora.build((None, 5, 3))
try:
    ed.einsum_dense_hyperparameters(lora)
    out["lora"] = None
except errors.UnsupportedEinsumError as e:
    out["lora"] = str(e)
relu = keras.layers.EinsumDense("abc,cd->abd", output_shape=(None, 4), activation="relu")
relu.build((None, 5, 3))
out["relu"] = ed.einsum_dense_hyperparameters(relu).activation
print("RESULT:" + json.dumps(out))
'''


# The tests of this Keras 3 child are marked keras3_suite: the same child whichever Keras
# this process binds (the Keras 3 suite runs them).
@pytest.fixture(scope="module")
def keras3_child(tmp_path_factory):
    pytest.importorskip("keras")
    return once_per_session(tmp_path_factory, "einsum_keras3_child", _run_keras3_child)


def _run_keras3_child():
    env = dict(os.environ)
    env.pop("TF_USE_LEGACY_KERAS", None)
    env["KERAS_BACKEND"] = "tensorflow"
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO_ROOT, env.get("PYTHONPATH")]))
    cases = [c for c in CASES]
    proc = subprocess.run([sys.executable, "-c", KERAS3_CHILD, json.dumps(cases)], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, check=False)
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT:")]
    assert proc.returncode == 0 and lines, (
        f"child failed (rc={proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("RESULT:"):])


@pytest.mark.keras3_suite
def test_keras3_layers_parse_and_match_tapes(keras3_child):
    assert keras3_child["keras_version"].startswith("3.")
    assert keras3_child["module"].startswith("keras.src.")
    assert len(keras3_child["cases"]) == len(CASES)
    for equation, _, bias_axes, input_shape in CASES:
        found = keras3_child["cases"][f"{equation}|{bias_axes}|{tuple(input_shape)}"]
        form = eq.parse_equation(equation, 1 + len(input_shape))
        assert found["equation"] == equation and found["bias_axes"] == bias_axes
        assert (found["rows"], found["d_in"], found["d_out"]) == (form.rows, form.d_in,
                                                                  form.d_out)
        assert found["input_rank"] == 1 + len(input_shape)
        assert found["max_error"] < 1e-11, found
        assert found["activation"] is None
    assert keras3_child["relu"] == "relu"


@pytest.mark.keras3_suite
def test_keras3_multi_head_attention_is_row_form(keras3_child):
    found = keras3_child["mha"]
    assert [(m["equation"], m["bias_axes"]) for m in found] == (
        [("abc,cde->abde", "de")] * 3 + [("abcd,cde->abe", "e")])
    assert [(m["rows"], m["d_in"], m["d_out"]) for m in found] == (
        [("b", "c", "de")] * 3 + [("b", "cd", "e")])
    assert all(m["ones"] for m in found)
    assert max(m["max_error"] for m in found) < 1e-11, found


@pytest.mark.keras3_suite
def test_keras3_lora_layer_is_refused(keras3_child):
    assert "LoRA or quantization" in keras3_child["lora"]
