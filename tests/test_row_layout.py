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
"""tf_tempered/privacy/row_layout.py: where the batch's examples are after each op between
layers: kept example-major, moved to another axis, rearranged across examples, or mixed."""

import pytest

from tf_tempered._compat import tf
from tf_tempered.privacy.row_layout import MIXED, REARRANGED, batch_axis

pytestmark = pytest.mark.keras3_suite  # the walk reads TF graphs only: no Keras version in it

TABLE = tf.constant([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])


def _pooled(t):  # [B, T, d] max-pooled over 2 x 2 windows of (T, d), same shape
    return tf.squeeze(tf.nn.max_pool2d(t[..., None], 2, 1, "SAME"), -1)


CASES = {  # x: [B, T, d] = [2, 4, 3], ids: [B, T] int32
    "attention scores q·kᵀ": (lambda x, ids: tf.matmul(x, x, transpose_b=True), 0),
    "attention by einsum": (lambda x, ids: tf.einsum("btd,bsd->bts", x, x), 0),
    "scores times values": (lambda x, ids: tf.matmul(tf.nn.softmax(
        tf.matmul(x, x, transpose_b=True)), x), 0),
    "heads split and merged": (lambda x, ids: tf.reshape(tf.transpose(tf.reshape(
        x, [2, 4, 3, 1]), [0, 2, 1, 3]), [2, 12]), 0),
    "time-major and back": (lambda x, ids: tf.transpose(
        tf.nn.tanh(tf.transpose(x, [1, 0, 2])), [1, 0, 2]), 0),
    "time-major": (lambda x, ids: tf.transpose(x, [1, 0, 2]), 1),
    "last time step": (lambda x, ids: x[:, -1], 0),
    "a time step of time-major": (lambda x, ids: tf.transpose(x, [1, 0, 2])[-1], 0),
    "embedding lookup": (lambda x, ids: tf.gather(TABLE, ids % 3), 0),
    # Rows rearranged or picked kept their mark through pooling, convolutions, einsums, FFTs
    # and segment sums (UNKNOWN before: a mixup with the reversed batch, then pooled, trained
    # 2.3 C; t - max_pool(t[0]) 3.6-6.1 C; probe H3).
    "reversed rows pooled, with the batch's": (lambda x, ids: x + _pooled(tf.reverse(x, [0])),
                                               MIXED),
    "one example's rows pooled, with the batch's": (lambda x, ids: x - tf.squeeze(
        tf.nn.max_pool1d(x[0][:, None], 1, 1, "SAME"), 1), MIXED),
    "one example's rows convolved, with the batch's": (lambda x, ids: x - tf.squeeze(
        tf.nn.conv1d(x[0][:, None], tf.ones([1, 3, 3]), 1, "SAME"), 1), MIXED),
    "reversed rows through an einsum, with the batch's": (lambda x, ids: x + tf.einsum(
        "btd,de->bte", tf.reverse(x, [0]), tf.ones([3, 3])), MIXED),
    "reversed rows summed by an einsum": (lambda x, ids: tf.einsum("btd->td", tf.reverse(
        x, [0])), MIXED),
    "reversed rows through an FFT, with the batch's": (lambda x, ids: x + tf.math.real(
        tf.signal.fft(tf.cast(tf.reverse(x, [0]), tf.complex64))), MIXED),
    "one example's rows summed by segment, with the batch's": (lambda x, ids: x[:, :2] - (
        tf.math.segment_sum(x[0], [0, 0, 1, 1])), MIXED),
    "each example's rows pooled": (lambda x, ids: _pooled(x), 0),
    "reversed rows pooled": (lambda x, ids: _pooled(tf.reverse(x, [0])), REARRANGED),
    "examples reordered": (lambda x, ids: tf.gather(x, [1, 0]), REARRANGED),
    "examples reversed": (lambda x, ids: tf.reverse(x, [0]), REARRANGED),
    "examples rolled": (lambda x, ids: tf.roll(x, 1, 0), REARRANGED),
    "batch of pairs": (lambda x, ids: tf.concat([x, x[:, ::-1]], 0), REARRANGED),
    # (Nothing given back: which rows a split, unstack or gather returns is not checked.)
    "halves split again": (lambda x, ids: tf.split(tf.concat([x, x], 0), 2)[0], REARRANGED),
    "a tile's copies unstacked": (lambda x, ids: tf.unstack(tf.tile(x, [1, 1, 2]), axis=2)[0],
                                  0),
    "a tile's copies split again": (lambda x, ids: tf.split(tf.tile(x, [2, 1, 1]), 2)[1],
                                    REARRANGED),
    "a concatenation gathered one row along": (lambda x, ids: tf.gather(
        tf.concat([x, x], 0), tf.range(1, tf.shape(x)[0] + 1)), REARRANGED),
    "halves of rolled and kept rows split again": (lambda x, ids: tf.split(
        tf.concat([tf.roll(x, 1, 0), tf.roll(x, 1, 0)], 0), 2)[0], REARRANGED),
    "halves of time-major rows split along time": (lambda x, ids: tf.split(tf.concat(
        [tf.transpose(x, [1, 0, 2])] * 2, 1), 2)[0], REARRANGED),
    "rolled, then a feature gathered": (lambda x, ids: tf.gather(tf.roll(x, 1, 0), 0, axis=2),
                                        REARRANGED),
    "rolled, then split over time": (lambda x, ids: tf.split(tf.roll(x, 1, 0), 2, 1)[0],
                                     REARRANGED),
    "reversed, then unstacked over time": (lambda x, ids: tf.unstack(
        tf.reverse(x, [0]), axis=1)[0], REARRANGED),
    "reversed, then gathered back": (lambda x, ids: tf.gather(tf.reverse(x, [0]), [1, 0]),
                                     REARRANGED),
    "batch mean": (lambda x, ids: x - tf.reduce_mean(x, [0, 1]), MIXED),
    "batch max, kept dims": (lambda x, ids: tf.reduce_max(x, 0, keepdims=True) + x, MIXED),
    "global max": (lambda x, ids: x / tf.reduce_max(tf.abs(x)), MIXED),
    "cumulative sum over examples": (lambda x, ids: tf.math.cumsum(x, 0), MIXED),
    "gram matrix of examples": (lambda x, ids: tf.matmul(x[:, 0], x[:, 0], transpose_b=True),
                                MIXED),
    "xᵀx over the batch": (lambda x, ids: tf.matmul(x[:, 0], x[:, 0], transpose_a=True), MIXED),
    "per-example statistic": (lambda x, ids: x - tf.reduce_mean(x, [1, 2], keepdims=True), 0),
    "mixed, then sliced": (lambda x, ids: (x - tf.reduce_mean(x, 0))[:1], MIXED),
    "a length of the batch": (lambda x, ids: tf.range(tf.shape(x)[0]), None),
    # Escapes a probe found in the first version of the walk:
    "flattened after a concatenation": (lambda x, ids: tf.reshape(tf.concat([x, x], 0),
                                                                  [4, -1]), REARRANGED),
    "examples reversed by a stride": (lambda x, ids: x[::-1], REARRANGED),
    "examples shuffled": (lambda x, ids: tf.random.shuffle(x), REARRANGED),
    "shifted by one example": (lambda x, ids: tf.pad(x, [[1, 0], [0, 0], [0, 0]])[:-1],
                               REARRANGED),
    "gathered by the batch's values": (lambda x, ids: tf.gather(x, ids[:, 0] % 2), REARRANGED),
    "the first example as reference": (lambda x, ids: x - x[:1], MIXED),
    "segment mean": (lambda x, ids: tf.math.segment_mean(x, [0, 0]), MIXED),
    "sorted over the examples": (lambda x, ids: tf.sort(x, axis=0), MIXED),
    "softmax over the examples": (lambda x, ids: tf.nn.softmax(x[:, 0], axis=0), MIXED),
    "pooled over the examples": (lambda x, ids: tf.nn.avg_pool1d(
        tf.transpose(x, [1, 0, 2]), 2, 1, "VALID"), MIXED),
    "einsum with an ellipsis": (lambda x, ids: tf.einsum("b...,b...->...", x, x), MIXED),
    "count of positives": (lambda x, ids: tf.cast(tf.shape(tf.where(x > 0))[0], tf.float32)
                           + x, MIXED),
    "per-example einsum with an ellipsis": (lambda x, ids: tf.einsum("b...d,de->b...e", x,
                                                                    tf.ones((3, 2))), 0),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_after_each_op(name):
    build, expected = CASES[name]
    found = []

    @tf.function
    def trace(x, ids):
        found.append(batch_axis(build(x, ids), {x.op, ids.op}))

    trace.get_concrete_function(tf.TensorSpec((2, 4, 3)), tf.TensorSpec((2, 4), tf.int32))
    assert found == [expected]


# Before: a batch of one example, flattened ([1, 4, 3] → [1, 12]), read as examples on axis 1
# (the reshape's rule for leading axes of length 1), so a custom loop's step on a 1-row batch
# through a Flatten was refused as "examples on axis 1".
@pytest.mark.parametrize("shape,expected", [([1, 12], 0), ([1, 4, 3, 1], 0), ([12], 0)])
def test_a_batch_of_one_example_reshaped_keeps_its_axis(shape, expected):
    found = []

    @tf.function
    def trace(x):
        found.append(batch_axis(tf.reshape(x, shape), {x.op}))

    trace.get_concrete_function(tf.TensorSpec((1, 4, 3)))
    assert found == [expected]
