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
"""tf_tempered/privacy/shared_args.py: which call arguments the batch's examples share.

The engine-level tests (the update exact with a shared [T, T] bias, and with a mask copied
to each example) are in test_conformance_generic.py."""

import types

import numpy as np
import pytest

from tf_tempered._compat import tf
from tf_tempered.privacy.shared_args import mark_shared_call_args, rows_alike

B = 4  # the batch's rows, and T: every case below has a first axis of 4


def row():  # [1, T], a constant of the trace that calls it
    return tf.constant([[1.0, 2.0, 3.0, 4.0]])


def square():  # [T, T]: rows differ
    return tf.constant(np.arange(16.0).reshape(4, 4), tf.float32)


ALIKE = {  # tensor -> whether its rows are one row repeated by construction
    "tf.tile of one row": (lambda: tf.tile(row(), [B, 1]), True),
    "broadcast_to of a vector": (lambda: tf.broadcast_to(row()[0], [B, 4]), True),
    "tf.repeat of one row": (lambda: tf.repeat(row(), B, axis=0), True),
    "tf.ones": (lambda: tf.ones([B, 4]), True),
    "tf.fill from a shape": (lambda: tf.fill(tf.stack([B, 4]), 2.0), True),
    "a constant with equal rows": (lambda: tf.constant(np.ones((B, 4)) * [1, 2, 3, 4]), True),
    "a tile, cast and scaled": (lambda: 3.0 * tf.cast(tf.tile(row() > 2.0, [B, 1]), tf.float32),
                                True),
    "a tile plus a broadcast row": (lambda: tf.tile(row(), [B, 1]) + row()[0], True),
    "a tile of a [1, T, T] square": (lambda: tf.tile(square()[None], [B, 1, 1]), True),
    "a square constant": (lambda: square(), False),
    "a square plus a tile": (lambda: square() + tf.tile(row(), [B, 1]), False),
    "a tile along the second axis": (lambda: tf.tile(square(), [1, 2]), False),
    "a transposed tile": (lambda: tf.transpose(tf.tile(row(), [B, 1])), False),
    "a gather of one row (not shown)": (lambda: tf.gather(row(), tf.zeros([B], tf.int32)), False),
}


@pytest.mark.parametrize("name", list(ALIKE))
def test_rows_alike(name):
    build, expected = ALIKE[name]
    seen = []

    @tf.function
    def traced():
        seen.append(rows_alike(build()))  # read off the trace: a Python bool
        return tf.constant(0)

    traced()
    assert seen == [expected]


class _Layer:  # a record's layer: only its identity is read
    pass


def _record(args, kwargs, inputs, slices=False, layer=None):
    return types.SimpleNamespace(inputs=inputs, call_args=args, call_kwargs=kwargs,
                                 handler=types.SimpleNamespace(slices_call_args=slices),
                                 shared_args=frozenset(), layer=layer or _Layer())


def test_marks_only_arguments_the_examples_share():
    weight = tf.Variable(np.eye(B), dtype=tf.float32)
    marked = {}

    @tf.function(input_signature=[tf.TensorSpec([B, B, 3])])
    def step(x):
        from_batch = tf.reduce_sum(x, -1)  # [B, T]: per example
        records = [
            _record((x, from_batch), {"bias": square(), "weight": tf.identity(weight),
                                       "tiled": tf.tile(row(), [B, 1]), "other": tf.ones([3, 3])},
                    x),
            _record((x, square()), {}, x, slices=True),  # a recurrent layer's: all sliced
        ]
        mark_shared_call_args(records, ({x.op}, {}))
        marked["generic"] = records[0].shared_args
        marked["slices"] = records[1].shared_args
        return x

    step(tf.zeros([B, B, 3]))
    # Leaves in tf.nest order: x, from_batch, then kwargs by key: bias, other, tiled, weight.
    assert marked["generic"] == {2, 5}
    assert marked["slices"] == frozenset()


@pytest.mark.filterwarnings("ignore:fit on a pipeline tf_tempered did not build")
def test_a_table_the_examples_share_is_passed_whole_eagerly_too():
    from dp_reference import assert_engine_matches_reference  # pylint: disable=import-outside-toplevel
    from tf_tempered._compat import keras  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(B, B, 3)).astype(np.float32), rng.integers(0, 3, B)
    table = rng.normal(size=(B, 3)).astype(np.float32) * 2  # [T, D], T == the batch size

    class AddTable(keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(name="w", shape=(3, 3))

        def call(self, h, table):
            return tf.tanh(tf.matmul(h + table, self.w))

    class Model(keras.Model):
        def __init__(self, dtype):
            super().__init__(dtype=dtype)
            self.add, self.pool, self.out = (AddTable(dtype=dtype),
                                             keras.layers.GlobalAveragePooling1D(dtype=dtype),
                                             keras.layers.Dense(3, dtype=dtype))

        def call(self, h):
            return self.out(self.pool(self.add(h, tf.constant(table, h.dtype))))

    def build(dtype):
        model = Model(dtype)
        model(x[:2].astype(dtype))
        return model

    assert_engine_matches_reference(build, x, y, static_batch=True, run_eagerly=True)
