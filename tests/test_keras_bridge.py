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
"""tf_tempered.keras_bridge: each function gives the same answer on Keras 2 and Keras 3.

The suite runs on both Kerases (Keras 2 with TF_USE_LEGACY_KERAS=1), so every test
here checks the branch of the Keras it runs on against what the other would give.
"""

import ast
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tf_tempered import keras_bridge
from tf_tempered._compat import KERAS_MAJOR, keras, tf

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "tf_tempered"


def _small_model():
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(3, name="hidden")(inputs)
    outputs = keras.layers.Dropout(0.5, name="drop")(hidden)
    outputs = keras.layers.Dense(2, name="out")(outputs)
    return keras.Model(inputs, outputs)


class _Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = keras.layers.Dense(2)

    def call(self, inputs):
        return self.dense(inputs)


def test_flatten_layers_and_own_weights():
    model = _small_model()
    names = [layer.name for layer in keras_bridge.flatten_layers(model)]
    assert names[-3:] == ["hidden", "drop", "out"]
    hidden = model.get_layer("hidden")
    assert [keras_bridge.shape_of(v) for v in keras_bridge.own_trainable_weights(hidden)] == [
        (4, 3), (3,)]
    hidden.trainable = False
    assert keras_bridge.own_trainable_weights(hidden) == []


def test_own_weights_of_a_recurrent_unit_include_its_cell():
    lstm = keras.layers.LSTM(3)
    lstm.build((None, 5, 2))
    assert keras_bridge.is_recurrent_unit(lstm)
    assert sorted(keras_bridge.shape_of(v) for v in keras_bridge.own_trainable_weights(lstm)) == [
        (2, 12), (3, 12), (12,)]
    model = keras.Sequential([keras.Input((5, 2)), lstm])
    assert id(lstm.cell) in keras_bridge.inside_recurrent_units(model)
    assert id(lstm) not in keras_bridge.inside_recurrent_units(model)


def test_random_layers_skip_rate_zero():
    model = _small_model()
    assert [layer.name for layer in keras_bridge.random_layers(model)] == ["drop"]
    quiet = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.0), keras.layers.Dense(1)])
    assert keras_bridge.random_layers(quiet) == []


def test_is_functional_model():
    assert keras_bridge.is_functional_model(_small_model())
    assert keras_bridge.is_functional_model(keras.Sequential([keras.Input((2,)),
                                                              keras.layers.Dense(1)]))
    subclassed = _Subclassed()
    subclassed(np.zeros((1, 3), np.float32))
    assert not keras_bridge.is_functional_model(subclassed)


def test_register_activation_name_keeps_a_users_own():
    def first(x):
        return x * 2.0

    def second(x):
        return x * 3.0

    name = "tf_tempered_bridge_test_activation"
    try:
        keras_bridge.register_activation_name(name, first)
        keras_bridge.register_activation_name(name, second)
        layer = keras.layers.Dense(1, activation=name, kernel_initializer="ones",
                                   bias_initializer="zeros")
        out = layer(np.ones((1, 2), np.float32))
        assert float(np.asarray(out)[0, 0]) == 4.0  # first(1 + 1): the first one kept
    finally:
        keras.utils.get_custom_objects().pop(name, None)
        if KERAS_MAJOR == 3:
            from keras.src import activations as keras_activations  # pylint: disable=g-import-not-at-top
            keras_activations.ALL_OBJECTS_DICT.pop(name, None)


def test_rnn_call_inputs_unpacks_tf_keras_lists():
    x, h0, c0 = (tf.zeros([2, 3, 4]), tf.ones([2, 5]), tf.ones([2, 5]))
    mask = tf.ones([2, 3], tf.bool)
    got_x, states, got_mask = keras_bridge.rnn_call_inputs([x, h0, c0], None, [mask, None, None])
    assert got_x is x and states == [h0, c0] and got_mask is mask
    assert keras_bridge.rnn_call_inputs([x], None, None) == (x, None, None)
    assert keras_bridge.rnn_call_inputs(x, [h0], mask) == (x, [h0], mask)
    assert keras_bridge.rnn_call_inputs([x, h0], [h0], None) is None  # states both ways
    assert keras_bridge.rnn_call_inputs([], None, None) is None


def test_rnn_call_result_type():
    result = keras_bridge.rnn_call_result("out", ["h", "c"])
    assert list(result) == ["out", "h", "c"]
    assert isinstance(result, tuple if KERAS_MAJOR == 3 else list)


def test_grouped_convolution_op():
    conv = keras.layers.Conv2D(4, 3, groups=2)
    conv.build((None, 5, 5, 2))
    op = keras_bridge.grouped_convolution_op(conv)
    if KERAS_MAJOR == 3:
        assert op is None
    else:  # tf-keras' XLA convolution, the same numbers as the plain one
        x = tf.random.stateless_normal([1, 5, 5, 2], seed=[1, 2])
        np.testing.assert_allclose(op(x, conv.kernel), conv.convolution_op(x, conv.kernel),
                                   rtol=1e-5, atol=1e-5)


def test_depthwise_kernel_and_derived_weights():
    layer = keras.layers.DepthwiseConv2D(3)
    layer.build((None, 5, 5, 2))
    assert keras_bridge.shape_of(keras_bridge.depthwise_kernel(layer)) == (3, 3, 2, 1)
    dense = keras.layers.Dense(4)
    dense.build((None, 3))
    assert keras_bridge.derived_weights(dense) is None
    if KERAS_MAJOR == 3:
        dense.enable_lora(2)
        assert "LoRA" in keras_bridge.derived_weights(dense)
        base, a, b, scale = keras_bridge.lora_factors(dense)
        assert [keras_bridge.shape_of(v) for v in (base, a, b)] == [(3, 4), (3, 2), (2, 4)]
        assert scale == 1.0  # lora_alpha defaults to the rank
    else:
        assert keras_bridge.lora_factors(dense) is None


def test_einsum_dense_input_rank():
    layer = keras.layers.EinsumDense("btd,de->bte", output_shape=(None, 6))
    layer.build((None, 5, 4))
    assert keras_bridge.einsum_dense_input_rank(layer, "btd", "bte") == 3


def test_embedding_variant():
    layer = keras.layers.Embedding(10, 3)
    assert keras_bridge.embedding_variant(layer) is None
    if KERAS_MAJOR == 2:
        assert "sparse" in keras_bridge.embedding_variant(keras.layers.Embedding(10, 3, sparse=True))


def test_set_untracked_is_not_a_weight():
    model = _small_model()
    before = len(model.weights)
    keras_bridge.set_untracked(model, "_bridge_test", tf.Variable(1.0))
    assert len(model.weights) == before and model._bridge_test.numpy() == 1.0  # pylint: disable=protected-access


def _private_keras_reads(path):
    """Lines of `path` that import keras.src / tf_keras.src / tensorflow.python."""
    tree = ast.parse(path.read_text())
    private = (["keras", "src"], ["tf_keras", "src"], ["tensorflow", "python"])
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module
            and node.module.split(".")[:2] in private]


def test_keras_internals_are_imported_only_by_the_bridge():
    """Keras' and TensorFlow's private modules are imported in keras_bridge/ only."""
    outside = {str(p.relative_to(PACKAGE)): lines for p in PACKAGE.rglob("*.py")
               if "keras_bridge" not in p.parts and (lines := _private_keras_reads(p))}
    assert outside == {}


def test_bridge_imports_nothing_of_ours_but_the_keras_selection():
    for path in (PACKAGE / "keras_bridge").glob("*.py"):
        tree = ast.parse(path.read_text())
        ours = {node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.startswith("tf_tempered")}
        assert ours <= {"tf_tempered._compat"} | {
            f"tf_tempered.keras_bridge.{p.stem}" for p in (PACKAGE / "keras_bridge").glob("*.py")}, path


def test_unpack_x_y_sample_weight():
    x, y = np.zeros((2, 1)), np.ones((2,))
    assert keras_bridge.unpack_x_y_sample_weight((x, y))[2] is None
    assert keras_bridge.unpack_x_y_sample_weight((x, y, y))[2] is y


# keras3_suite: TensorFlow's oneDNN switch, read without Keras; the same on either Keras.
@pytest.mark.keras3_suite
def test_onednn_enabled_follows_tensorflows_switch():
    """TF_ENABLE_ONEDNN_OPTS=1/0 turns TF's oneDNN CPU kernels on/off; the bridge reads which."""
    env = dict(os.environ, PYTHONPATH=str(PACKAGE.parent), TF_CPP_MIN_LOG_LEVEL="3")
    code = "from tf_tempered import keras_bridge; print(keras_bridge.onednn_enabled())"
    procs = {switch: subprocess.Popen([sys.executable, "-c", code], text=True,
                                      env=dict(env, TF_ENABLE_ONEDNN_OPTS=switch),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for switch in ("0", "1")}
    answers = {}
    for switch, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        answers[switch] = out.split()[-1]
    assert answers == {"0": "False", "1": "True"}
    assert isinstance(keras_bridge.onednn_enabled(), bool)


def test_keras_classes_are_told_apart_by_their_package():
    """A user class named like a Keras one is not Keras'; a subclass of Keras' is, by its
    MRO."""
    class MixUp(keras.layers.Layer):  # a user's layer of the same name as Keras 3's
        pass

    class Norm(keras.layers.BatchNormalization):
        def call(self, inputs, training=None):
            return super().call(inputs, training=training)

    assert not keras_bridge.mixes_batch_examples(MixUp())
    assert keras_bridge.keras_class_named(Norm(), ("BatchNormalization",))
    assert keras_bridge.is_trainable_batch_norm(Norm())


def test_traced_by_a_fit_sees_train_step_only():
    seen = []

    class Probe(keras.Model):
        def train_step(self, data):
            seen.append(keras_bridge.traced_by_a_fit())
            return super().train_step(data)

    inputs = keras.Input((2,))
    model = Probe(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), verbose=0)
    tf.function(lambda: seen.append(keras_bridge.traced_by_a_fit()) or 0)()
    assert seen[0] is True and seen[-1] is False


def test_source_dataset_reads_a_tf_data_iterator_and_a_distributed_dataset():
    dataset = tf.data.Dataset.range(5).batch(2)
    assert int(keras_bridge.source_dataset(iter(dataset)).cardinality()) == 3
    distributed = tf.distribute.OneDeviceStrategy("/cpu:0").experimental_distribute_dataset(
        dataset)
    assert keras_bridge.source_dataset(distributed) is dataset
    assert keras_bridge.source_dataset(dataset) is dataset
    numbers = iter([1, 2])
    assert keras_bridge.source_dataset(numbers) is numbers


def test_custom_gradient_code_names_the_files_the_gradient_runs():
    @tf.custom_gradient
    def doubled(t):
        return tf.identity(t), lambda u: 2.0 * u

    def files(function):
        graph = tf.function(function).get_concrete_function(tf.TensorSpec([2])).graph
        return [keras_bridge.custom_gradient_code(op) for op in graph.get_operations()
                if "_gradient_op_type" in op.node_def.attr]

    [ours] = files(doubled)
    assert __file__ in ours and not all(map(keras_bridge.is_library_file, ours))
    [silu] = files(tf.nn.silu)
    assert silu and all(map(keras_bridge.is_library_file, silu))


def test_with_function_bodies_reads_loop_bodies_and_branches():
    def body(i, t):
        return i + 1, t + tf.random.uniform([2])

    def f(t):
        _, t = tf.while_loop(lambda i, _: i < 2, body, (0, t))
        return tf.cond(t[0] > 0, lambda: tf.random.normal([2]), lambda: t)

    ops = tf.function(f).get_concrete_function(tf.TensorSpec([2])).graph.get_operations()
    types = [op.type for op in keras_bridge.with_function_bodies(ops)]
    assert "RandomUniform" not in [op.type for op in ops]
    assert {"RandomUniform", "RandomStandardNormal"} <= set(types)


def test_declared_axes_read_the_weights_and_fill_unknown_axes_only():
    lstm = keras.layers.LSTM(3)
    lstm.build((None, 5, 6))
    assert keras_bridge.declared_axes(lstm) == {-1: 6}
    assert keras_bridge.declared_axes(keras.layers.Dense(3)) == {}  # not built
    widths = []
    for data_format in ("channels_last", "channels_first"):  # the last axis: a spatial one
        conv_lstm = keras.layers.ConvLSTM1D(2, 1, data_format=data_format)
        conv_lstm.build((None, 2, 3, 4))
        widths.append(keras_bridge.declared_axes(conv_lstm).get(-1))
    assert widths == [4, None]  # (channels_first was given 3: probe G3, F3)
    dense = keras.layers.Dense(3)
    dense.build((None, 4))
    # A kernel contracting a middle axis fixes that one (probe G3, F4: a TypeError);
    # with an ellipsis, the axes after it count from the end.
    middle = keras.layers.EinsumDense("abc,bd->acd", (7, 5))
    middle.build((None, 4, 7))
    ellipsis = keras.layers.EinsumDense("...bc,cd->...bd", (None, 5))
    ellipsis.build((None, 3, 4, 6))
    assert keras_bridge.declared_axes(middle) == {1: 4}
    assert keras_bridge.declared_axes(ellipsis) == {-1: 6}
    shapes = []

    @tf.function(input_signature=[tf.TensorSpec([None, None, None])])
    def traced(t):
        for layer in (dense, middle):
            u = tf.identity(t)
            keras_bridge.with_declared_axes(layer, u)
            shapes.append(u.shape.as_list())
        return t

    traced(tf.zeros([2, 4, 4]))
    assert shapes == [[None, None, 4], [None, 4, None]]


@pytest.mark.parametrize("equation,operands", [
    ("abc,cd->abd", ("abc", "cd", "abd")), ("... b , bd -> ...d", ("...b", "bd", "...d")),
    ("abc->ab", None), ("ab,bc,cd->ad", None), ("ab,bc", None), ("ab,b->a->a", None)])
def test_einsum_operands_split_two_operand_equations(equation, operands):
    assert keras_bridge.einsum_operands(equation) == operands
