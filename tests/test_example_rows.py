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
"""tf_tempered/privacy/example_rows.py: a layer called on rows that are not the batch's
examples (keras.io's position embedding on tf.range(maxlen), a ViT's positions [1, P]) is
refused before any update; positions broadcast to the batch train with the exact update."""

import warnings

import numpy as np
import pytest

from dp_reference import (assert_exact_update, assert_update, engine_update, median_clip,
                          per_example_reference, sparse_crossentropy_mean)
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import UnsupportedLayerError, make_private

VOCAB, DIM = 20, 4


class _TokenAndPosition(keras.layers.Layer):
    """keras.io's TokenAndPositionEmbedding; broadcast=True: positions broadcast to the batch."""

    def __init__(self, maxlen, broadcast=False, dtype=None):
        super().__init__(dtype=dtype)
        self.broadcast = broadcast
        self.tokens = keras.layers.Embedding(VOCAB, DIM, dtype=dtype)
        self.positions = keras.layers.Embedding(maxlen, DIM, dtype=dtype)

    def call(self, x):
        positions = tf.range(tf.shape(x)[-1])
        if self.broadcast:
            positions = tf.broadcast_to(positions, tf.shape(x))
        return self.tokens(x) + self.positions(positions)


def _model(maxlen, broadcast=False, dtype="float32"):
    return keras.Sequential([keras.Input((maxlen,), dtype="int32"),
                             _TokenAndPosition(maxlen, broadcast, dtype=dtype),
                             keras.layers.GlobalAveragePooling1D(dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


def _data(batch, maxlen, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, VOCAB, (batch, maxlen)).astype(np.int32), rng.integers(0, 3, batch)


def _assert_refused_before_any_update(model, x, y, match, *, batch_size,
                                      sampling="shuffle", loss=None):
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0, sampling=sampling)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss or
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match=match):
        model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))



# Before: B divides maxlen (and B = maxlen) trained with every update wrong, silently (the
# positions' rows split into "examples"); otherwise TF's reshape error named no fix.
@pytest.mark.parametrize("batch, maxlen", [(6, 6), (3, 6), (8, 6)])
def test_a_position_embedding_on_a_range_is_refused_before_any_update(batch, maxlen):
    x, y = _data(batch, maxlen)
    _assert_refused_before_any_update(
        _model(maxlen), x, y, r"is called on .*rows.*Fix: call it on a tensor with the batch's "
        r"examples on the first axis.*broadcast_to", batch_size=batch)


class _PatchEncoder(keras.layers.Layer):
    """keras.io's ViT PatchEncoder: positions of shape [1, P]."""

    def __init__(self, patches):
        super().__init__()
        self.patches = patches
        self.projection = keras.layers.Dense(DIM)
        self.positions = keras.layers.Embedding(patches, DIM)

    def call(self, x):
        positions = tf.expand_dims(tf.range(self.patches), 0)
        return self.projection(x) + self.positions(positions)


def test_a_vit_patch_encoder_s_positions_of_shape_one_by_p_are_refused():
    model = keras.Sequential([keras.Input((5, 3)), _PatchEncoder(5), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(16, 5, 3)).astype(np.float32)
    with pytest.raises(UnsupportedLayerError, match="called on 1 rows for a batch of"):
        model.fit(x, np.zeros(16), batch_size=4, verbose=0)


@pytest.mark.parametrize("batch", [6, 4])
def test_positions_broadcast_to_the_batch_train_with_the_exact_update(batch):
    x, y = _data(batch, 6)
    assert_exact_update(lambda dtype="float32": _model(6, broadcast=True, dtype=dtype), x, y)


class _Rows(keras.layers.Layer):
    """Rows of the two inputs rearranged before one shared Dense, or kept example-major."""

    def __init__(self, how, dtype=None):
        super().__init__(dtype=dtype)
        self.how = how
        self.dense = keras.layers.Dense(DIM, dtype=dtype)

    def call(self, inputs):
        a, b = inputs  # [B, T, 3] each
        if self.how == "concat":  # a siamese encoder run once on both
            h = self.dense(tf.concat([a, b], 0))
            return tf.concat(tf.split(h, 2), -1)
        if self.how == "time_major":
            h = tf.transpose(self.dense(tf.transpose(a, [1, 0, 2])), [1, 0, 2])
            return tf.concat([h, h], -1)
        if self.how == "tile":
            return tf.concat(tf.split(self.dense(tf.tile(a, [2, 1, 1])), 2), -1)
        if self.how == "stacked":  # tf.stack on axis 1: rows 2i, 2i + 1 are example i's
            h = self.dense(tf.reshape(tf.stack([a, b], axis=1), [-1, 4, 3]))
            return tf.reshape(h, [-1, 4, 2 * DIM])
        if self.how == "separate":
            return tf.concat([self.dense(a), self.dense(b)], -1)
        raise ValueError(self.how)


def _rows_model(how, dtype="float32"):
    a, b = keras.Input((4, 3), dtype=dtype), keras.Input((4, 3), dtype=dtype)
    h = _Rows(how, dtype=dtype)([a, b])
    h = keras.layers.GlobalAveragePooling1D(dtype=dtype)(h)
    return keras.Model([a, b], keras.layers.Dense(3, dtype=dtype)(h))


def _rows_data(batch):
    rng = np.random.default_rng(1)
    x = [rng.normal(size=(batch, 4, 3)).astype(np.float32) for _ in range(2)]
    return x, rng.integers(0, 3, batch)


# Before: each trained with every update wrong, silently (a probe measured a clipped sum
# 0.1067 > 2C when one example was replaced): the handler split the rows in order.
@pytest.mark.parametrize("how, what", [("concat", "rearranged"), ("tile", "rearranged"),
                                       ("time_major", "on axis 1")])
def test_rows_rearranged_across_examples_are_refused_before_any_update(how, what):
    x, y = _rows_data(4)  # T = B: the first axis is the batch's length either way
    _assert_refused_before_any_update(
        _rows_model(how), x, y, rf"{what}.*Fix: call the layer once per part.*encoder\(a\) and "
        r"encoder\(b\)", batch_size=4)


@pytest.mark.parametrize("how", ["separate", "stacked"])
def test_rows_kept_example_major_train_with_the_exact_update(how):
    x, y = _rows_data(4)
    assert_exact_update(lambda dtype="float32": _rows_model(how, dtype=dtype), x, y)


def _cropped(how, dtype="float32"):
    """A fixed-size crop of each image, then a convolution."""
    crop = {"slice_by_batch_length": lambda t: tf.slice(
                t, [0, 1, 1, 0], tf.stack([tf.shape(t)[0], 4, 4, 1])),
            "crop_to_bounding_box": lambda t: tf.image.crop_to_bounding_box(t, 1, 1, 4, 4),
            "resize_with_crop_or_pad": lambda t: tf.image.resize_with_crop_or_pad(t, 4, 7),
            "rows_padded_by_a_reshaped_stack": lambda t: tf.pad(t, tf.reshape(  # shifted
                tf.stack([1, 0, 0, 0, 1, 1, 0, 0]), [4, 2]))[:-1]}[how]
    inputs = keras.Input((6, 6, 1), dtype=dtype)
    h = keras.layers.Lambda(crop, dtype=dtype)(inputs)
    h = keras.layers.Conv2D(2, 3, dtype=dtype)(h)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(keras.layers.Flatten(
        dtype=dtype)(h)))


@pytest.mark.parametrize("how", ["slice_by_batch_length", "crop_to_bounding_box",
                                 "resize_with_crop_or_pad"])
def test_a_fixed_size_crop_of_every_example_trains_with_the_exact_update(how):
    # Before: refused as mixing examples when TF folded tf.shape(t)[0] to the batch's static
    # length (tf-keras' RandomCrop and CenterCrop in a model too), or as rearranged rows when
    # tf.image padded by a reshaped stack of zeros for the batch's axis (probe S, F6).
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6, 6, 1)), rng.integers(0, 3, 8)
    assert_exact_update(lambda dtype="float32": _cropped(how, dtype=dtype), x, y)


def _first_example_added_by_a_slice_to_the_first_axis_s_length(h):
    u = h[None]  # the batch on axis 1: tf.shape(u)[0] is 1, so the slice is example 0 alone
    return h + u[:, :tf.shape(u)[0]][0]


def test_a_slice_to_the_first_axis_s_length_off_the_batch_s_axis_is_refused():
    # Before: taken for the whole batch (the first axis' length was compared, not the batch
    # axis'): example 0 was added to every example, 8.16x the bound (probe A2, F2).
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype(np.float32), rng.integers(0, 3, 8)
    inputs = keras.Input((5,))
    hidden = keras.layers.Lambda(_first_example_added_by_a_slice_to_the_first_axis_s_length)(
        keras.layers.Dense(4)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(3)(hidden))
    _assert_refused_before_any_update(model, x, y, "several examples", batch_size=4)


def test_rows_added_to_the_batch_by_a_reshaped_stack_of_paddings_are_refused():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6, 6, 1)), rng.integers(0, 3, 8)
    _assert_refused_before_any_update(_cropped("rows_padded_by_a_reshaped_stack"), x, y,
                                      "rearranged", batch_size=4)


def _centered(where, dtype="float32"):
    """Dense layers with the batch mean subtracted before the last one, or after it."""
    inputs = keras.Input((5,), dtype=dtype)
    h = keras.layers.Dense(4, activation="tanh", dtype=dtype)(inputs)
    if where == "between_layers":
        h = keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=0), dtype=dtype)(h)
    if where == "per_example":  # over the features: each example's own statistic
        h = keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, axis=-1, keepdims=True),
                                dtype=dtype)(h)
    outputs = keras.layers.Dense(3, dtype=dtype)(h)
    if where == "after_the_last_layer":
        outputs = keras.layers.Lambda(lambda t: t - tf.reduce_max(t, axis=0), dtype=dtype)(outputs)
    return keras.Model(inputs, outputs)


def _centroid_loss(y_true, y_pred):
    """Pulls each example's prediction to the batch's centroid (plus cross-entropy)."""
    pull = tf.reduce_sum(tf.square(y_pred - tf.reduce_mean(y_pred, axis=0)), axis=-1)
    return keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True) + pull


# Before: each trained silently with DP-SGD's noise but no bound on what one example changes
# (every example's gradient depended on all of them).
@pytest.mark.parametrize("where, loss, subject", [
    ("between_layers", "crossentropy", "is called on values computed from several examples"),
    ("after_the_last_layer", "crossentropy", "The per-example losses are computed from"),
    ("none", "centroid", "The per-example losses are computed from")])
@pytest.mark.parametrize("sampling", ["poisson", "shuffle"])
def test_values_mixing_the_batch_s_examples_are_refused_before_any_update(where, loss, subject,
                                                                          sampling):
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        _centered(where), x, np.zeros(32), subject + r".*Fix: compute every statistic per "
        "example", batch_size=8, sampling=sampling,
        loss=_centroid_loss if loss == "centroid" else None)


def test_a_statistic_of_each_example_s_own_features_trains_with_the_exact_update():
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    keras.utils.set_random_seed(0)
    assert_exact_update(lambda dtype="float32": _centered("per_example", dtype), x, y)


class _HandWrittenBatchNorm(keras.layers.Layer):
    """Batch normalization written out: a layer with weights (the generic path) whose call
    normalizes with the batch's mean and variance."""

    def build(self, input_shape):
        self.gamma = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="beta")

    def call(self, x):  # pylint: disable=arguments-differ
        mean, variance = tf.nn.moments(x, axes=[0])
        return self.gamma * (x - mean) / tf.sqrt(variance + 1e-3) + self.beta


# Before: it trained; removing one outlier example moved the clipped sum by 3.0 C (a probe).
def test_a_custom_layer_mixing_the_batch_inside_its_own_call_is_refused():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), _HandWrittenBatchNorm(),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        model, x, np.zeros(32), r"Layer 'dense_\d+' \(Dense\) is called on values computed "
        "from several examples", batch_size=8, sampling="poisson")


class _Centred(keras.layers.Layer):
    """Subtracts a statistic from its input, computed inside a tf.while_loop, a tf.cond or a
    nested tf.function: over the batch (``over="examples"``, axis 0) or over each example's
    own features (``over="features"``)."""

    def __init__(self, inside, over, **kwargs):
        super().__init__(**kwargs)
        self.inside, self.axis = inside, 0 if over == "examples" else -1

    def _centre(self, t):
        return t - tf.reduce_mean(t, axis=self.axis, keepdims=True)

    def call(self, x):  # pylint: disable=arguments-differ
        if self.inside == "while_loop":
            return tf.while_loop(lambda i, t: i < 2, lambda i, t: (i + 1, self._centre(t)),
                                 (tf.constant(0), x))[1]
        if self.inside == "cond":
            return tf.cond(tf.shape(x)[0] > 0, lambda: self._centre(x), lambda: x)
        if self.inside == "cond_on_the_batch":  # one branch for all, chosen by all
            return tf.cond(tf.reduce_mean(x) > 0, lambda: 2.0 * x, lambda: x)
        return tf.function(self._centre)(x)


def _centred_inside(inside, over, dtype="float32"):
    return keras.Sequential([keras.Input((5,), dtype=dtype),
                             keras.layers.Dense(4, activation="tanh", dtype=dtype),
                             _Centred(inside, over, dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


# Before: each trained silently (the walk did not enter loops, conds or nested tf.functions).
@pytest.mark.parametrize("inside", ["while_loop", "cond", "cond_on_the_batch", "function"])
def test_mixing_inside_a_loop_a_cond_or_a_nested_function_is_refused(inside):
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        _centred_inside(inside, "examples"), x, np.zeros(32),
        r"Layer 'dense_\d+' \(Dense\) is called on values computed from several examples",
        batch_size=8, sampling="poisson")


@pytest.mark.parametrize("inside", ["while_loop", "cond", "function"])
def test_per_example_work_inside_a_loop_a_cond_or_a_nested_function_is_exact(inside):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    keras.utils.set_random_seed(0)
    assert_exact_update(lambda dtype="float32": _centred_inside(inside, "features", dtype), x, y)


def _running_total(t):
    """t minus the sum of the examples before it and itself, in a tf.while_loop over them."""
    def body(i, total, rows):
        total = total + t[i]
        return i + 1, total, rows.write(i, total)
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0])
    _, _, rows = tf.while_loop(lambda i, *_: i < tf.shape(t)[0], body,
                               (tf.constant(0), tf.zeros_like(t[0]), rows))
    return t - rows.stack()


def _each_example_in_a_loop(t):
    """Per-example work in a tf.while_loop reading t[i] and writing row i (no mixing)."""
    def body(i, rows):
        return i + 1, rows.write(i, t[i] * tf.reduce_sum(t[i]))
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0])
    _, rows = tf.while_loop(lambda i, _: i < tf.shape(t)[0], body, (tf.constant(0), rows))
    return t + rows.stack()


def _fourier_over_the_examples(t):
    spectrum = tf.signal.rfft(tf.transpose(t))  # each feature's FFT over the batch's axis
    doubled = tf.signal.irfft(spectrum * tf.cast(2.0, spectrum.dtype), fft_length=tf.shape(t)[:1])
    return tf.reshape(tf.transpose(doubled), [-1, 4])


def _in_python(t):
    out = tf.py_function(lambda v: v * 2.0, [t], t.dtype)
    out.set_shape(t.shape)
    return out


def _running_total_of_slices(t):
    """The same running total, of one-row slices ``t[i:i + 1]``."""
    def body(i, total, rows):
        total = tf.ensure_shape(total + t[i:i + 1], [1, 4])
        return i + 1, total, rows.write(i, total[0])
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0])
    _, _, rows = tf.while_loop(lambda i, *_: i < tf.shape(t)[0], body,
                               (tf.constant(0), tf.zeros_like(t[:1]), rows))
    return t - rows.stack()


def _running_total_in_a_tensor_array(t):
    """Row i: row i plus row i - 1 of the total, read back from the TensorArray it is kept in."""
    def body(i, rows):
        return i + 1, rows.write(i, rows.read(i - 1) + t[i])
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0], clear_after_read=False).write(0, t[0])
    _, rows = tf.while_loop(lambda i, _: i < tf.shape(t)[0], body, (tf.constant(1), rows))
    return rows.stack()


def _next_example_subtracted_in_a_loop(t):
    def body(i, rows):
        return i + 1, rows.write(i, t[i] - t[(i + 1) % tf.shape(t)[0]])
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0])
    _, rows = tf.while_loop(lambda i, _: i < tf.shape(t)[0], body, (tf.constant(0), rows))
    return rows.stack()


def _each_example_gathered_in_a_loop(t):
    def body(i, rows):
        return i + 1, rows.write(i, tf.tanh(tf.gather(t, i)))
    rows = tf.TensorArray(t.dtype, size=tf.shape(t)[0])
    _, rows = tf.while_loop(lambda i, _: i < tf.shape(t)[0], body, (tf.constant(0), rows))
    return t + rows.stack()


def _centred_on_axis_0(t):
    return t - tf.reduce_mean(t, axis=0)


def _each_row_restacked(t, function, order=slice(None)):
    """tf.stack([function(row) for row in tf.unstack(t)[order]]) when the batch's length is
    known (a traced step), else t (Keras' symbolic call while building the model)."""
    if t.shape[0] is None:
        return t
    return tf.stack([function(row) for row in tf.unstack(t)[order]])


def _loop_counted_by_one_example(t):
    """Scales every row 1.5 times per iteration, as many as the first example's value says."""
    count = tf.cast(tf.clip_by_value(tf.gather_nd(t, [[0, 0]])[0] * 3.0, 0.0, 5.0), tf.int32)
    return tf.while_loop(lambda i, rows: i < count, lambda i, rows: (i + 1, rows * 1.5),
                         [0, t])[1]


def _own_positions(t):
    """[[row, the row's largest entry's column]]: each example's own position."""
    return tf.stack([tf.range(tf.shape(t)[0]), tf.argmax(t, 1, output_type=tf.int32)], 1)


def _reversed_positions_named_as_tf_s_batch_gather(t):
    n = tf.shape(t)[0]
    with tf.name_scope("BatchGatherND"):
        index = tf.concat([tf.range(n)[::-1, None], tf.zeros([n, 1], tf.int32)], -1)
    return tf.gather_nd(tf.reshape(t, [-1, 2, 2]), index)


def _put_back_at_the_positives(t, values_of_kept_rows):
    """Each positive entry replaced by ``values_of_kept_rows`` of the positives (a 1-D
    tensor, tf.boolean_mask's), scattered back at their positions (tf.where)."""
    positive = t > 0
    return tf.scatter_nd(tf.where(positive), values_of_kept_rows(tf.boolean_mask(t, positive)),
                         tf.shape(t, out_type=tf.int64))


def _loop_run_as_long_as_one_example_says(t):
    """Halves every row while the first example's first value is above 1."""
    return tf.while_loop(lambda rows: rows[0, 0] > 1.0, lambda rows: [rows / 2.0], [t])[0]


def _next_example_written_in_a_tensor_array(t):
    """Row i: example i + 1's row (rows shifted by one, the last wrapping round)."""
    n = tf.shape(t)[0]
    def body(i, rows):
        return i + 1, rows.write(i, t[(i + 1) % n])
    _, rows = tf.while_loop(lambda i, _: i < n, body,
                            (tf.constant(0), tf.TensorArray(t.dtype, size=n)))
    return tf.reshape(rows.stack(), tf.shape(t))


def _each_row_scattered_in_a_loop(t, row):
    """A while loop writing example i's row (doubled) at row(i, n) of a zero tensor."""
    n = tf.shape(t)[0]
    return tf.while_loop(lambda i, acc: i < n, lambda i, acc: (i + 1, tf.tensor_scatter_nd_update(
        acc, [[row(i, n)]], [t[i] * 2.0])), [0, tf.zeros_like(t)])[1]


def _gathered_by_positions(t, positions):
    """Each row's first two values of the rows an [n, n, 2] index names: positions(n) beside
    column 0."""
    rows = positions(tf.shape(t)[0])
    return tf.reshape(tf.gather_nd(t, tf.stack([rows, tf.zeros_like(rows)], -1))[:, :2], [-1, 2])


def _each_example_written_in_a_tensor_array(t):
    n = tf.shape(t)[0]
    written = tf.TensorArray(t.dtype, size=n, element_shape=t.shape[1:])
    _, written = tf.while_loop(lambda i, ta: i < n,
                               lambda i, ta: (i + 1, ta.write(i, tf.sin(t[i]))), [0, written])
    return written.stack()


def _rows_written_in_a_growing_tensor_array(t, length):
    """A tf.TensorArray of size 0 that grows as a loop writes sin(t[i]) at i < length(n)."""
    n = tf.shape(t)[0]
    written = tf.TensorArray(t.dtype, size=0, dynamic_size=True, element_shape=t.shape[1:])
    _, written = tf.while_loop(lambda i, ta: i < length(n),
                               lambda i, ta: (i + 1, ta.write(i, tf.sin(t[i]))), [0, written])
    return written.stack()


def _the_previous_row_chosen_by_a_cond(t, i):
    own, previous = t[i], t[tf.maximum(i - 1, 0)]
    return tf.cond(i > 0, lambda: previous * 2.0, lambda: own)


def _next_positions(t):
    """Each example's position and the next one's, a column each: [n, 2]."""
    n = tf.shape(t)[0]
    return tf.transpose(tf.stack([tf.range(n), (tf.range(n) + 1) % n]))


def _rows_written_while_below_a_shrinking_limit(t):
    """A growing tf.TensorArray written at i < limit, the limit falling to 1 in the loop."""
    written = tf.TensorArray(t.dtype, size=0, dynamic_size=True, element_shape=t.shape[1:])
    _, _, written = tf.while_loop(
        lambda i, limit, ta: i < limit,
        lambda i, limit, ta: (i + 1, tf.minimum(limit, 1), ta.write(i, t[i])),
        [0, tf.shape(t)[0], written])
    return written.stack()


def _each_row_written_one_back_then_at_its_own(t):
    """ta.write(i - 1, t[i]).write(i, t[i]): row r holds example r + 1's (the last, its own)."""
    n = tf.shape(t)[0]
    written = tf.TensorArray(t.dtype, size=n, element_shape=t.shape[1:])
    _, written = tf.while_loop(
        lambda i, ta: i < n,
        lambda i, ta: (i + 1, ta.write(tf.maximum(i - 1, 0), t[i]).write(i, t[i])), [0, written])
    return written.stack()


def _the_first_row_carried_through_a_loop(t):
    _, carried = tf.while_loop(lambda k, row: k < 2, lambda k, row: (k + 1, row * 2.0), [0, t[0]])
    return t + carried


def _the_previous_row_carried_by_a_nested_function(t):
    """Row c of the list is t[c - 1]: a tf.function writes the row it was given and picks
    the next, carried to the next iteration."""
    @tf.function
    def write_and_pick(written, k, row):
        return written.write(k, row), t[k]

    def body(k, row, written):
        written, picked = write_and_pick(written, k, row)
        return k + 1, picked, written

    written = tf.TensorArray(t.dtype, size=tf.shape(t)[0], element_shape=t.shape[1:])
    _, _, written = tf.while_loop(lambda k, row, ta: k < tf.shape(t)[0], body,
                                  [0, tf.zeros_like(t[0]), written])
    return written.stack()


def _positions_rewritten_in_the_loop(t):
    """A list of positions from tf.range(n), read at the counter, rewritten in the loop so
    that row c reads example c + 1's."""
    n = tf.shape(t)[0]
    positions = tf.TensorArray(tf.int32, size=n, clear_after_read=False).unstack(tf.range(n))
    written = tf.TensorArray(t.dtype, size=n, element_shape=t.shape[1:])

    def body(c, positions, written):
        written = written.write(c, t[positions.read(c)])
        return c + 1, positions.write(tf.minimum(c + 1, n - 1), (c + 2) % n), written

    _, _, written = tf.while_loop(lambda c, p, w: c < n, body, [0, positions, written])
    return written.stack()


_PICKING_OR_TRANSFORMING = {
    "one_row_subtracted": lambda t: t - t[0],
    "one_row_by_tf_slice": lambda t: t - tf.slice(t, [0, 0], [1, -1]),
    "one_row_with_an_ellipsis": lambda t: t - t[0, ...],
    "a_squeezed_batch_mean": lambda t: t - tf.reduce_mean(tf.squeeze(t[:, :1])),
    "running_total_of_slices_in_a_while_loop": _running_total_of_slices,
    "running_total_in_a_tensor_array": _running_total_in_a_tensor_array,
    "the_next_example_subtracted_in_a_loop": _next_example_subtracted_in_a_loop,
    "the_first_example_subtracted_in_tf_map_fn": lambda t: tf.map_fn(lambda row: row - t[0], t),
    "one_value_multiplied": lambda t: t * t[0, 0],
    "running_total_in_a_while_loop": _running_total,
    "cumulative_tf_scan": lambda t: tf.scan(lambda total, row: total + row, t),
    "qr_over_the_examples": lambda t: tf.reshape(tf.linalg.qr(t)[0], [-1, 4]),
    "fourier_over_the_examples": _fourier_over_the_examples,
    "py_function": _in_python,
    "a_branch_chosen_by_one_example": lambda t: tf.cond(t[0, 0] > 0, lambda: t * 2.0,
                                                        lambda: t),
    "a_loop_run_as_long_as_one_example_says": _loop_run_as_long_as_one_example_says,
    "a_gather_nd_of_the_rows_centred": lambda t: _centred_on_axis_0(
        tf.gather_nd(t, tf.range(tf.shape(t)[0])[:, None])),
    "a_scatter_of_the_rows_centred": lambda t: _centred_on_axis_0(
        tf.scatter_nd(tf.range(tf.shape(t)[0])[:, None], t, tf.shape(t))),
    "rows_unstacked_and_stacked_again_centred": lambda t: _centred_on_axis_0(
        _each_row_restacked(t, lambda row: row * 2.0)),
    "a_branch_chosen_by_one_value_read_by_gather_nd": lambda t: tf.cond(
        tf.gather_nd(t, [[0, 0]])[0] > 0, lambda: t * 2.0, lambda: t),
    "a_loop_run_as_many_times_as_one_example_says": _loop_counted_by_one_example,
    "a_label_pick_over_part_of_the_batch": lambda t: t + tf.gather_nd(
        t, tf.stack([tf.range(1), tf.zeros([1], tf.int32)], 1))[:, None],
    "tf_map_fn_s_results_centred": lambda t: _centred_on_axis_0(
        tf.map_fn(lambda row: row * 2.0, t)),
    "tf_map_fn_s_rows_gathered_by_position_centred": lambda t: _centred_on_axis_0(tf.map_fn(
        lambda i: tf.gather(t, i), tf.range(tf.shape(t)[0]), fn_output_signature=t.dtype)),
    "a_prefix_of_the_batch_up_to_a_loop_s_index": lambda t: tf.map_fn(
        lambda i: tf.reduce_sum(t[:i + 1], 0), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "two_rows_from_a_loop_s_index": lambda t: tf.map_fn(
        lambda i: tf.reduce_sum(t[i:i + 2], 0), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "tf_map_fn_over_one_position_broadcast": lambda t: t - tf.map_fn(
        lambda i: tf.gather(t, i), tf.range(1), fn_output_signature=t.dtype),
    "tf_map_fn_over_the_first_two_positions_averaged": lambda t: t - tf.reduce_mean(tf.map_fn(
        lambda i: t[i] * 2.0, tf.range(2), fn_output_signature=t.dtype), 0),
    "tf_map_fn_over_the_first_half_averaged": lambda t: t - tf.reduce_mean(tf.map_fn(
        lambda i: t[i] * 2.0, tf.range(tf.shape(t)[0] // 2), fn_output_signature=t.dtype), 0),
    "a_prefix_of_a_length_known_while_running_summed": lambda t: t - tf.reduce_sum(
        t[:tf.shape(t)[0] // 2], 0),
    "tf_map_fn_s_prefix_sums_to_a_length_known_while_running": lambda t: tf.map_fn(
        lambda i: tf.reduce_sum(t[:tf.maximum(i, 1)], 0), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    # (Trained: a part of the batch lined up with it by a repeat, or one row from a length
    # known only while the step runs broadcast; probe L, 1.3-2.9 x 2C.)
    "the_batch_repeated_then_its_first_rows": lambda t: tf.repeat(t, 2, axis=0)[:tf.shape(t)[0]],
    "one_row_of_a_length_known_while_running_broadcast": lambda t: t - t[
        :tf.minimum(tf.shape(t)[0], 1)],
    "tf_map_fn_over_the_first_half_of_the_positions_repeated": lambda t: tf.repeat(tf.map_fn(
        lambda i: t[i], tf.range((tf.shape(t)[0] + 1) // 2), fn_output_signature=t.dtype), 2,
        axis=0)[:tf.shape(t)[0]],
    # (Trained before: a growing tf.TensorArray's stack claimed nothing.)
    "the_first_example_written_in_a_growing_tensor_array_broadcast": lambda t: t - (
        _rows_written_in_a_growing_tensor_array(t, lambda n: 1)),
    "half_the_examples_written_in_a_growing_tensor_array_repeated": lambda t: t - tf.repeat(
        _rows_written_in_a_growing_tensor_array(t, lambda n: n // 2), 2, axis=0),
    # (Trained before, and at this stop's first version: picks by a static index carried
    # through a loop became UNKNOWN; a pick by a function's argument inside the loop counted
    # as the same rows in every iteration; probe N, 1.0-3.0 x 2C.)
    "the_first_row_carried_through_a_loop": _the_first_row_carried_through_a_loop,
    "the_previous_row_carried_by_a_nested_function": _the_previous_row_carried_by_a_nested_function,
    "rows_written_while_below_a_limit_that_shrinks_in_the_loop": lambda t: t + (
        _rows_written_while_below_a_shrinking_limit(t)),
    "reversed_rows_gathered_one_by_one_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: t[i] + tf.gather(tf.reverse(t, [0]), i), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "tf_map_fn_over_the_positions_reversed": lambda t: t + tf.map_fn(
        lambda i: tf.gather(t, i), tf.range(tf.shape(t)[0])[::-1], fn_output_signature=t.dtype),
}
_REARRANGING = {
    "rows_unstacked_and_stacked_in_reverse": lambda t: _each_row_restacked(
        t, lambda row: row, order=slice(None, None, -1)),
    "one_row_scattered_over_another": lambda t: tf.tensor_scatter_nd_update(t, [[0]], [t[1]]),
    "the_next_example_written_in_a_tensor_array": _next_example_written_in_a_tensor_array,
    "tf_split_halves_swapped": lambda t: tf.concat(tf.split(t, 2)[::-1], 0),
    "a_tensor_array_gathered_in_reverse": lambda t: tf.TensorArray(
        t.dtype, size=tf.shape(t)[0]).unstack(t).gather(tf.range(tf.shape(t)[0])[::-1]),
    "tf_dynamic_stitch_of_the_rows_reversed": lambda t: tf.dynamic_stitch(
        [tf.range(tf.shape(t)[0])[::-1]], [t]),
    "the_first_examples_rows_by_a_meshgrid_index_along_the_other_axis": lambda t: tf.gather_nd(
        t, tf.stack([tf.meshgrid(tf.range(2), tf.range(tf.shape(t)[0]))[0],
                     tf.broadcast_to(tf.constant([0, 3]), [tf.shape(t)[0], 2])], -1)),
    # (Trained before: positions broadcast along the index's other axis, or tiled and
    # flattened, were taken for each example's own; probe L, 1.4-2.1 x 2C.)
    "positions_broadcast_along_the_other_axis_of_an_index": lambda t: _gathered_by_positions(
        t, lambda n: tf.broadcast_to(tf.range(n), [n, n])),
    "positions_times_ones_along_the_other_axis_of_an_index": lambda t: _gathered_by_positions(
        t, lambda n: tf.range(n)[None, :] * tf.ones(tf.stack([n, 1]), tf.int32)),
    "positions_tiled_and_flattened_as_if_repeated": lambda t: tf.reshape(tf.gather_nd(t, tf.stack(
        [tf.reshape(tf.tile(tf.expand_dims(tf.range(tf.shape(t)[0]), 0), [1, 2]), [-1]),
         tf.repeat(tf.range(2), tf.shape(t)[0])], 1)), [-1, 2]),
    "each_example_s_row_scattered_into_the_next_row_in_a_loop": lambda t: (
        _each_row_scattered_in_a_loop(t, lambda i, n: (i + 1) % n)),
    "the_batch_shifted_by_a_padding_known_while_running": lambda t: tf.pad(
        t, [[tf.shape(t)[0] // tf.shape(t)[0], 0], [0, 0]])[:-1],
    "rows_a_mask_kept_reversed_and_put_back": lambda t: _put_back_at_the_positives(
        t, lambda kept: kept[::-1]),
    "rows_a_mask_kept_reversed_and_written_over_the_batch": lambda t: (
        tf.tensor_scatter_nd_update(t, tf.where(t > 0), tf.gather_nd(t, tf.where(t > 0))[::-1])),
    # (Trained before: rows picked by either of two indices, one the loop's own position,
    # counted as written where they were read; and refused, though per example, when a
    # branch picked them, its copy of the position taken for another index.)
    "the_previous_example_chosen_by_a_cond_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: _the_previous_row_chosen_by_a_cond(t, i), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "the_previous_example_picked_in_a_cond_s_branch_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: tf.cond(i > 0, lambda: t[i - 1] * 2.0, lambda: t[i]),
        tf.range(tf.shape(t)[0]), fn_output_signature=t.dtype),
    # (Trained before: a gather, split or unstack of moved rows along another axis claimed
    # nothing, as if it gave a concatenation's parts back; probe L, 1.0-1.6 x 2C.)
    "rolled_rows_gathered_along_the_features": lambda t: tf.gather(tf.roll(t, 1, 0), [0, 1, 2],
                                                                   axis=1),
    "rolled_rows_split_along_the_features": lambda t: tf.split(tf.roll(t, 1, 0), [1, 3], 1)[1],
    "rolled_rows_unstacked_along_the_features_and_stacked": lambda t: tf.stack(
        tf.unstack(tf.roll(t, 1, 0), axis=1)[:3], 1),
    "the_batch_s_axis_merged_by_a_reshape_then_gathered_row_by_row": lambda t: tf.transpose(
        tf.reshape(tf.gather(tf.reshape(tf.transpose(t), [4, 1, -1]), tf.broadcast_to(
            (tf.range(tf.shape(t)[0]) + 1) % tf.shape(t)[0], [4, tf.shape(t)[0]]), axis=2,
            batch_dims=1), [4, -1])),
    # (Trained before: an index concatenated under a name scope called BatchGatherND was
    # trusted by its name; probe L, 1.1 x 2C.)
    "reversed_positions_under_the_name_tf_gives_batch_dims_gather_nd": (
        _reversed_positions_named_as_tf_s_batch_gather),
    # (Trained before, and at this stop's first version, which let a split or gather of a
    # concatenation claim nothing; probe M, 1.2-1.8 x 2C.)
    "a_concatenation_gathered_one_row_along": lambda t: tf.gather(
        tf.concat([t, t], 0), tf.range(1, tf.shape(t)[0] + 1)),
    "a_concatenation_s_quarters_taken_off_by_one": lambda t: tf.concat(
        tf.split(tf.concat([t, t], 0), 4)[1:3], 0),
    # (Trained before or at this stop's first version: a transposed stack of positions and other
    # values taken for positions, and writes over rearranged rows, a growing list's limit
    # read before the loop, tf.switch_case not followed; probe M, 1.2-2.8 x 2C.)
    "positions_beside_the_next_ones_flattened_into_a_gather_nd_index": lambda t: tf.reshape(
        tf.gather_nd(t, tf.reshape(_next_positions(t), [-1])[:, None]), [-1, 8]),
    # (Trained before: a list of positions rewritten in the loop still counted as each
    # example's own; probe N, 1.2-1.5 x 2C.)
    "positions_rewritten_in_the_loop_that_reads_them": _positions_rewritten_in_the_loop,
    "each_row_written_one_back_then_at_its_own_position": (
        _each_row_written_one_back_then_at_its_own),
    "the_previous_example_chosen_by_tf_switch_case_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: tf.switch_case(tf.cast(i > 0, tf.int32), [lambda: t[i], lambda: t[i - 1]]),
        tf.range(tf.shape(t)[0]), fn_output_signature=t.dtype),
    "a_concatenation_s_halves_given_back_through_an_activation": lambda t: tf.split(
        tf.nn.relu(tf.concat([t, t * 2.0], 0)), 2)[0],
}
_PER_EXAMPLE = {
    "tf_map_fn": lambda t: t + tf.map_fn(lambda row: row * tf.reduce_sum(row), t),
    "a_while_loop_over_the_examples": _each_example_in_a_loop,
    "tf_gather_in_a_while_loop": _each_example_gathered_in_a_loop,
    "qr_of_each_example": lambda t: tf.reshape(
        tf.linalg.qr(tf.reshape(t, [-1, 2, 2]))[0], [-1, 4]),
    # (The five below trained before too, the gather_nd or scatter not followed: kept
    # training, each example's rows followed; a probe found the first two refused by this
    # stop's first rules.)
    "a_branch_chosen_by_each_example_in_tf_map_fn": lambda t: tf.map_fn(
        lambda row: tf.cond(row[0] > 0, lambda: row * 2.0, lambda: row - 1.0), t),
    "rows_unstacked_and_stacked_again_in_order": lambda t: _each_row_restacked(
        t, lambda row: row * tf.reduce_sum(row)),
    "a_scatter_into_each_example_s_own_row": lambda t: tf.tensor_scatter_nd_update(
        t, _own_positions(t), tf.zeros(tf.shape(t)[:1], t.dtype)),
    "a_label_pick_written_as_a_concat": lambda t: t * tf.gather_nd(t, tf.concat(
        [tf.range(tf.shape(t)[0])[:, None], _own_positions(t)[:, 1:]], 1))[:, None],
    "tf_map_fn_over_positions_gathering_each_row": lambda t: tf.map_fn(
        lambda i: tf.gather(t, i) * 2.0, tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "each_example_s_row_written_in_a_tensor_array_of_the_batch_s_length":
        _each_example_written_in_a_tensor_array,
    # (Refused before: each branch's copy of the position was taken for another index.)
    # (A branch on the position alone, i >= 0 here: one on i > 0 would treat the first
    # example otherwise than in a batch of one, the reference's.)
    "a_branch_on_the_position_reading_its_row_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: tf.cond(i >= 0, lambda: t[i] * 2.0, lambda: t[i]), tf.range(tf.shape(t)[0]),
        fn_output_signature=t.dtype),
    "a_branch_on_the_row_s_value_reading_it_in_tf_map_fn": lambda t: tf.map_fn(
        lambda i: tf.cond(t[i, 0] > 0, lambda: t[i] * 2.0, lambda: t[i] - 1.0),
        tf.range(tf.shape(t)[0]), fn_output_signature=t.dtype),
    "each_example_s_row_written_in_a_growing_tensor_array": lambda t: t * (
        _rows_written_in_a_growing_tensor_array(t, lambda n: n)),
    "each_example_s_row_scattered_into_its_own_row_in_a_loop": lambda t: (
        _each_row_scattered_in_a_loop(t, lambda i, n: i)),
    "features_padded_by_an_amount_known_while_running": lambda t: tf.pad(
        t, [[0, 0], [0, tf.shape(t)[1] // 2]])[:, :4] * 2.0,
    # (Refused before as rows rearranged: a probe's false refusals, BERT-MLM-style picks.)
    "several_positions_of_each_example_by_a_meshgrid_index": lambda t: tf.gather_nd(
        t, tf.stack([tf.meshgrid(tf.range(tf.shape(t)[0]), tf.range(2), indexing="ij")[0],
                     tf.broadcast_to(tf.constant([0, 3]), [tf.shape(t)[0], 2])], -1)),
    "several_positions_of_each_example_by_tf_repeat": lambda t: tf.reshape(tf.gather_nd(
        t, tf.stack([tf.repeat(tf.range(tf.shape(t)[0]), 2),
                     tf.tile(tf.constant([0, 3]), tf.shape(t)[:1])], 1)), [-1, 2]),
    # (Trained before by the name of TF's index op, checked by its ops now; batch_dims=2 is
    # refused now, its index's second column not checked.)
    "several_positions_of_each_example_by_gather_nd_with_batch_dims_1": lambda t: tf.gather_nd(
        t, tf.broadcast_to(tf.constant([[0], [3]]), tf.stack([tf.shape(t)[0], 2, 1])),
        batch_dims=1) * 2.0,
    # (Trained before too, the scatter at a mask's positions not followed.)
    "rows_a_mask_kept_put_back": lambda t: _put_back_at_the_positives(
        t, lambda kept: kept * tf.exp(kept)),
    "rows_a_mask_kept_doubled_over_the_batch": lambda t: tf.tensor_scatter_nd_update(
        t, tf.where(t > 0), 2.0 * tf.gather_nd(t, tf.where(t > 0))),
}


def _dense_lambda_dense(function, dtype="float32"):
    return keras.Sequential([keras.Input((5,), dtype=dtype),
                             keras.layers.Dense(4, activation="tanh", dtype=dtype),
                             keras.layers.Lambda(function, dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


# Before: each trained silently, every example's gradient depending on others' rows (the walk
# claimed nothing for a row taken by an index, a loop's rows, a scan, and took a QR, an FFT
# or a Python function over the batch's axis for per-example work; a cond or loop decided by
# one example's value, a gather_nd, a scatter or an unstack-and-stack claimed nothing after).
@pytest.mark.parametrize("what", sorted(_PICKING_OR_TRANSFORMING))
def test_rows_picked_by_an_index_or_transformed_over_the_batch_are_refused(what):
    _assert_lambda_refused(_PICKING_OR_TRANSFORMING[what], "values computed from several "
                           "examples", sampling="poisson")


# Before: each trained silently (a stack, a scatter or a TensorArray write of rows in
# another order, and tf.split's halves swapped, claimed nothing).
@pytest.mark.parametrize("what", sorted(_REARRANGING))
def test_rows_put_in_another_order_are_refused(what):
    _assert_lambda_refused(_REARRANGING[what], "rows of the batch's examples rearranged",
                           sampling="shuffle")


# Before: trained silently (Keras 3's take_along_axis on the batch's axis swaps it last,
# merges it by a reshape and gathers with batch_dims: the gather claimed nothing; probe L,
# 2.0-2.1 x 2C with every row reading the first examples).
@pytest.mark.skipif(not hasattr(keras, "ops"), reason="keras.ops is Keras 3's")
def test_keras_take_along_axis_on_the_batch_s_axis_is_refused():
    def first_examples(t):  # [B, 2, 2] (a 2-D t takes another path, refused before too)
        rows = keras.ops.reshape(t, (-1, 2, 2))
        taken = keras.ops.take_along_axis(rows, keras.ops.broadcast_to(
            keras.ops.arange(2)[None, :, None], keras.ops.shape(rows)), axis=0)
        return keras.ops.reshape(taken, (-1, 4))
    _assert_lambda_refused(first_examples, "rows of the batch's examples rearranged",
                           sampling="shuffle")


# Before (this stop's first version): each example's position repeated in a tf.gather_nd
# index gives two rows per example, example-major; a half of them was taken for the batch
# (probe M, 1.1-1.6 x 2C).
@pytest.mark.parametrize("part", [
    lambda rows: tf.split(rows, 2)[0], lambda rows: tf.reshape(rows, [2, -1, 4])[1]])
def test_a_part_of_rows_repeated_per_example_is_refused(part):
    def first_half(t):
        return part(tf.gather_nd(t, tf.stack([tf.repeat(tf.range(tf.shape(t)[0]), 2)], 1)))
    # (The reshape to [2, B, 4] holds several examples in a row: refused as rearranged.)
    _assert_lambda_refused(first_half, "rows of (some of the batch's examples|the batch's "
                                       "examples rearranged)", sampling="shuffle")


def _assert_lambda_refused(function, what, sampling):
    """A Dense after a Lambda of ``function`` is refused as called on ``what``."""
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        _dense_lambda_dense(function), x, np.zeros(32),
        rf"Layer 'dense_\d+' \(Dense\) is called on {what}", batch_size=8, sampling=sampling)


@pytest.mark.parametrize("what", sorted(_PER_EXAMPLE))
def test_each_example_s_rows_read_by_an_index_train_with_the_exact_update(what):
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    keras.utils.set_random_seed(0)
    assert_exact_update(lambda dtype="float32": _dense_lambda_dense(_PER_EXAMPLE[what], dtype),
                         x, y)


def _picked_row_loss(y_true, y_pred):
    return keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred - y_pred[0], from_logits=True)


def _above_the_batch_mean_loss(y_true, y_pred):
    """Hard-example mining: each example's crossentropy where it is above the batch's mean."""
    loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
    return loss * tf.cast(loss > tf.reduce_mean(loss), loss.dtype)


# Before: each trained silently (the first example's prediction in every example's loss;
# the batch's mean crossentropy, from an op the walk did not follow, in every example's).
@pytest.mark.parametrize("loss", [_picked_row_loss, _above_the_batch_mean_loss])
def test_a_loss_using_other_examples_rows_is_refused(loss):
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        _centered("none"), x, np.zeros(32), "The per-example losses are computed from",
        batch_size=8, sampling="poisson", loss=loss)


def _label_picked_by_gather_nd(y_true, y_pred):
    labels = tf.cast(tf.reshape(y_true, [-1]), tf.int32)
    positions = tf.stack([tf.range(tf.shape(labels)[0]), labels], 1)
    return -tf.gather_nd(tf.nn.log_softmax(y_pred), positions)


def _label_picked_by_gather_nd_of_batch_dims(y_true, y_pred):
    labels = tf.cast(tf.reshape(y_true, [-1, 1]), tf.int32)
    return -tf.gather_nd(tf.nn.log_softmax(y_pred), labels, batch_dims=1)


# Trained before too (gather_nd claimed nothing); now followed as each example's own rows.
@pytest.mark.parametrize("loss", [_label_picked_by_gather_nd,
                                  _label_picked_by_gather_nd_of_batch_dims])
def test_a_loss_picking_each_example_s_label_by_gather_nd_trains_exactly(loss):
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(6, 5)).astype(np.float32), rng.integers(0, 3, 6)
    assert_exact_update(lambda dtype="float32": _dense_lambda_dense(tf.identity, dtype), x, y,
                        loss=loss)


def _tagger(dtype="float32"):
    return keras.Sequential([keras.Input((6,), dtype="int32"),
                             keras.layers.Embedding(VOCAB, DIM, dtype=dtype),
                             keras.layers.Dense(VOCAB, dtype=dtype)])


# tf-keras computes it with tf.boolean_mask and a scatter back at tf.where(mask), which the
# walk now follows (it claimed nothing after the scatter before); Keras 3 with a product.
def test_a_loss_ignoring_a_class_trains_with_the_exact_update():
    rng = np.random.default_rng(7)
    tokens = rng.integers(1, VOCAB, (6, 6)).astype(np.int32)
    tokens[:, 4:] = 0
    per_token = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0,
                                                          reduction="none")
    weights = _tagger().get_weights()
    norms, reference = per_example_reference(
        _tagger, weights, tokens, tokens, lambda y, p, model: tf.reduce_mean(per_token(y, p)))
    clip = median_clip(norms)
    model = _tagger()
    model.set_weights(weights)
    ours, _ = engine_update(model, tokens, tokens, clip=clip, loss=(
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)))
    assert_update(ours, reference(clip))


def _category_counts(dtype="float32"):
    """Keras' CategoryEncoding (multi-hot counts of each example's ids: tf.math.bincount per
    row, its number of bins from the batch's largest id clipped to num_tokens)."""
    return keras.Sequential([keras.Input((4,), dtype="int32"),
                             keras.layers.CategoryEncoding(num_tokens=VOCAB, output_mode="count",
                                                           dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


# Before: refused as values computed from several examples (the bins' number, from the
# batch's largest id) although each example's counts are its own.
def test_category_counts_of_each_example_train_with_the_exact_update():
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, VOCAB, (6, 4)).astype(np.int32), rng.integers(0, 3, 6)
    assert_exact_update(_category_counts, x, y)


def _decoder_from_an_encoder_s_states(rnn, centred, dtype="float32"):
    """A seq2seq-style model: a recurrent layer started from another's last states (its own
    call, through tf_tempered's native time loop on CPU), pooled, then maybe centred over
    the batch."""
    inputs = keras.Input((5, 3), dtype=dtype)
    states = rnn(4, return_state=True, dtype=dtype)(inputs)[1:]
    decoded = rnn(4, return_sequences=True, dtype=dtype)(inputs, initial_state=states)
    pooled = keras.layers.GlobalAveragePooling1D(dtype=dtype)(decoded)
    if centred:
        pooled = keras.layers.Lambda(lambda t: t - tf.reduce_mean(t, 0), dtype=dtype)(pooled)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(pooled))


# Before: trained silently (the walk did not follow tf_tempered's own LSTM and GRU time loops
# in a recurrent layer's call, so what came after them claimed nothing).
@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_a_batch_statistic_after_a_recurrent_layer_s_own_call_is_refused(rnn):
    x = np.random.default_rng(0).normal(size=(16, 5, 3)).astype(np.float32)
    _assert_refused_before_any_update(
        _decoder_from_an_encoder_s_states(getattr(keras.layers, rnn), centred=True), x,
        np.zeros(16), r"Layer 'dense(_\d+)?' \(Dense\) is called on values computed from several",
        batch_size=8)


@pytest.mark.parametrize("rnn", ["LSTM", "GRU"])
def test_a_decoder_started_from_an_encoder_s_states_trains_with_the_exact_update(rnn):
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(6, 5, 3)).astype(np.float32), rng.integers(0, 3, 6)
    keras.utils.set_random_seed(0)
    assert_exact_update(lambda dtype="float32": _decoder_from_an_encoder_s_states(
        getattr(keras.layers, rnn), centred=False, dtype=dtype), x, y)


def _one_hot_column(t):  # a categorical feature of each example, one-hot encoded
    return tf.concat([t, tf.one_hot(tf.cast(t[:, 0] > 0, tf.int32), 2, dtype=t.dtype)], 1)


def _pixel_shuffled(t):  # depth_to_space of each example's 4 values into a 2 x 2 image
    return tf.reshape(tf.nn.depth_to_space(tf.reshape(t, [-1, 1, 1, 4]), 2), [-1, 4])


def _batch_centered(t):
    return t - tf.reduce_mean(t, axis=0, keepdims=True)


# Before: the walk claimed nothing after a one-hot encoding or a depth_to_space (UNKNOWN) and
# a batch statistic after them trained (one replaced example moved the clipped sum 2.6-6.9
# C); a softmax over the batch's axis, its permutation built at run time, was lost when the
# batch's length equalled the width; rows reshaped to hold two or eight examples each were
# taken for the batch's (a mean over each pair: 2.2 C; probe H2, F1 and F2). The walk ended at
# a dilated convolution's space_to_batch too (4.4-4.7 C; probe H3).
_MIXED_AFTER = {
    "one_hot_then_batch_centering": lambda t: _batch_centered(_one_hot_column(t)),
    "depth_to_space_then_batch_centering": lambda t: _batch_centered(_pixel_shuffled(t)),
    "softmax_over_a_batch_as_long_as_the_width": lambda t: tf.nn.softmax(
        tf.concat([t, t], 1), axis=0)[:, :4],
}
_MERGED_ROWS = {
    "a_mean_over_pairs_of_examples": lambda t: tf.reshape(
        tf.reshape(t, [-1, 2, 4]) - tf.reduce_mean(tf.reshape(t, [-1, 2, 4]), 1, keepdims=True),
        [-1, 4]),
    "a_softmax_over_groups_of_four": lambda t: tf.reshape(
        tf.nn.softmax(tf.reshape(t, [-1, 16])), [-1, 4]),
}


def _dilated_conv(t):  # each example's 4 values tiled to a 4 x 4 image, a dilated 3 x 3 kernel
    kernel = tf.constant(np.linspace(-1.0, 1.2, 9).reshape(3, 3, 1, 1), t.dtype)
    images = tf.nn.convolution(tf.reshape(tf.tile(t, [1, 4]), [-1, 4, 4, 1]), kernel,
                               padding="SAME", dilations=2)  # space_to_batch, conv, batch_to_space
    return tf.reduce_mean(tf.reshape(images, [-1, 4, 4]), axis=2)


def _dilated_conv1d(t):  # each example's 4 values as a sequence, a kernel of 3 dilated by 2
    kernel = tf.constant([[[0.5]], [[-1.0]], [[0.75]]], t.dtype)
    # space_to_batch, ExpandDims, a 2-D convolution, Squeeze, batch_to_space
    return tf.nn.convolution(t[..., None], kernel, padding="SAME", dilations=2)[..., 0]


def _blocks_mean_put_back(t):  # a mean over every example's blocks, put back in place
    blocks = tf.space_to_batch(t[..., None], [2], [[0, 0]])
    mean = tf.reduce_mean(blocks, 0, keepdims=True) + 0.0 * blocks[:2]
    return t - tf.batch_to_space(mean, [2], [[0, 0]])[..., 0]


# (Probe P2: a 1-D dilated convolution's ExpandDims and Squeeze between the blocks, and a
# statistic of the blocks, went unseen: 7.1-7.9 C.)
_MIXED_AFTER.update({
    "dilated_conv_then_batch_centering": lambda t: _batch_centered(_dilated_conv(t)),
    "dilated_conv1d_then_batch_centering": lambda t: _batch_centered(_dilated_conv1d(t)),
    "a_mean_of_the_blocks_put_back": _blocks_mean_put_back,
})
# (batch_to_space with a block of 1 gave UNKNOWN: reversed rows reached a Dense; P2, F3.)
_MERGED_ROWS_AFTER_BLOCKS = {
    "reversed_rows_through_batch_to_space": lambda t: tf.batch_to_space(
        tf.reverse(t, [0])[..., None], [1], [[0, 0]])[..., 0],
}


@pytest.mark.parametrize("what", sorted(_MIXED_AFTER))
def test_a_batch_statistic_after_one_hot_depth_to_space_or_dilated_conv_is_refused(what):
    _assert_lambda_refused(_MIXED_AFTER[what], "values computed from several examples",
                           sampling="shuffle")


@pytest.mark.parametrize("what", sorted(_MERGED_ROWS))
def test_rows_holding_several_examples_are_refused(what):
    _assert_lambda_refused(_MERGED_ROWS[what], "rows of the batch's examples rearranged",
                           sampling="shuffle")


@pytest.mark.parametrize("what", sorted(_MERGED_ROWS_AFTER_BLOCKS))
def test_rows_reversed_before_batch_to_space_are_refused(what):
    _assert_lambda_refused(_MERGED_ROWS_AFTER_BLOCKS[what],
                           "rows of the batch's examples rearranged", sampling="shuffle")


def _loss_of_reversed_rows_less_the_first(y_true, y_pred):
    rows = tf.reverse(y_pred, [0])
    return tf.reduce_sum((rows - rows[:1]) ** 2, -1)


# Before: only MIXED losses were refused, and rows moved across examples then combined among
# themselves stayed REARRANGED: 4.5-6.1 C (probe P2, F4).
def test_a_loss_of_rows_rearranged_across_examples_is_refused():
    x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
    _assert_refused_before_any_update(
        _dense_lambda_dense(tf.identity), x, np.zeros(32),
        r"per-example losses are computed from rows of the batch's examples rearranged.*Fix",
        batch_size=8, loss=_loss_of_reversed_rows_less_the_first)


def _fit_batches_of_unknown_length(model, jit_compile=False):
    """A fit on tf.data batches of 8 without drop_remainder (30 examples): the batch's length
    is unknown while the step traces."""
    x = np.random.default_rng(0).normal(size=(30, 5)).astype(np.float32)
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1), jit_compile=jit_compile,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the batches' sampling is the user's)
        model.fit(tf.data.Dataset.from_tensor_slices((x, np.arange(30) % 3)).batch(8),
                  verbose=0)


# Before: with the batch's length unknown while tracing, rows of several examples trained
# (2.2-4.9 C; probe H3); the step checks the reshape's rows when it runs now.
@pytest.mark.parametrize("what", sorted(_MERGED_ROWS))
def test_rows_holding_several_examples_fail_the_step_when_the_batch_length_is_unknown(what):
    model = _dense_lambda_dense(_MERGED_ROWS[what])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="A reshape put rows of several examples together.*Fix"):
        _fit_batches_of_unknown_length(model)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_rows_holding_several_examples_train_nothing_under_xla():
    # XLA drops the assertion: the clipped sums turn NaN instead.
    model = _dense_lambda_dense(_MERGED_ROWS["a_mean_over_pairs_of_examples"])
    _fit_batches_of_unknown_length(model, jit_compile=True)
    assert all(np.isnan(w).all() for w in model.get_weights())


def _pairs_centred(h):  # [B, 4] -> [B/2, 2, 4], each pair of examples centred
    pairs = tf.reshape(h, [-1, 2, 4])
    return tf.reshape(pairs - tf.reduce_mean(pairs, 1, keepdims=True), [-1, 4])


class _PairsCentredIn(keras.layers.Layer):
    def __init__(self, where, **kwargs):
        super().__init__(**kwargs)
        self.where = where

    @tf.function
    def _centred(self, h):
        return _pairs_centred(h)

    def call(self, h):
        if self.where == "function":
            return self._centred(h)
        if self.where == "cond":
            return tf.cond(tf.shape(h)[0] > 0, lambda: _pairs_centred(h), lambda: h)
        return tf.while_loop(lambda i, t: i < 1, lambda i, t: (i + 1, _pairs_centred(t)),
                             [0, h])[1]

    def compute_output_shape(self, input_shape):
        return input_shape


# Before: a reshape in a function's graph (a tf.function method, a branch, a loop's body) was
# not checked with the batch's length known, nor when the step ran: 3.6-6.9 C (probe P3, F1).
@pytest.mark.parametrize("where", ["function", "cond", "loop"])
@pytest.mark.parametrize("length_known", [True, False])
def test_rows_of_several_examples_in_a_function_s_graph_are_refused(where, length_known):
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4),
                              _PairsCentredIn(where), keras.layers.Dense(3)])
    match = r"Layer 'dense_\d+' \(Dense\) is called on rows of the batch's examples rearranged"
    if length_known:
        x = np.random.default_rng(0).normal(size=(32, 5)).astype(np.float32)
        _assert_refused_before_any_update(model, x, np.zeros(32), match, batch_size=8)
        return
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match=match):
        _fit_batches_of_unknown_length(model)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_an_example_s_rows_merged_back_train_when_the_batch_length_is_unknown():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Lambda(
        lambda t: tf.reshape(tf.tile(t, [1, 2]), [-1, 5])),  # each example's 2 rows
        keras.layers.Dense(4, activation="tanh"),
        keras.layers.Lambda(lambda t: tf.reshape(t, [-1, 8])), keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]
    _fit_batches_of_unknown_length(model)
    assert all(np.isfinite(w).all() and (w != b).any()
               for w, b in zip(model.get_weights(), before))


@pytest.mark.parametrize("function", [_one_hot_column, _pixel_shuffled, _dilated_conv,
                                      _dilated_conv1d])
def test_each_example_s_one_hot_depth_to_space_or_dilated_conv_trains_exactly(function):
    x = np.random.default_rng(0).normal(size=(8, 5)).astype(np.float32)
    assert_exact_update(lambda dtype="float32": _dense_lambda_dense(function, dtype=dtype),
                        x, np.arange(8) % 3)


def _rows_through_a_dense(dtype="float32"):  # each example's 8 rows through one Dense, back
    inputs = keras.Input((8, 4), dtype=dtype)
    h = keras.layers.Lambda(lambda t: tf.reshape(t, [-1, 4]), dtype=dtype)(inputs)
    h = keras.layers.Dense(5, activation="tanh", dtype=dtype)(h)
    h = keras.layers.Lambda(lambda t: tf.reshape(t, [-1, 8 * 5]), dtype=dtype)(h)
    return keras.Model(inputs, keras.layers.Dense(3, dtype=dtype)(h))


# Before: in a batch of one example, [T, d] -> [1, T·d] took the leading 1 for padding and
# put the batch on axis 1: refused (probe H3); any larger batch trained.
@pytest.mark.parametrize("batch", [1, 4])
def test_an_example_s_rows_merged_back_train_exactly_in_a_batch_of_any_size(batch):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(batch, 8, 4)).astype(np.float32), np.arange(batch) % 3
    weights = _rows_through_a_dense().get_weights()
    norms, reference = per_example_reference(_rows_through_a_dense, weights, x, y,
                                             sparse_crossentropy_mean)
    clip = float(np.min(norms)) / 2  # every example clipped (one example has no median)
    model = _rows_through_a_dense()
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip,
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert_update(ours, reference(clip))


def _sparse_input_model(sparse, middle=None):
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,), sparse=sparse)
    h = keras.layers.Lambda(lambda t: tf.reshape(tf.sparse.to_dense(t), [-1, 6]),
                            output_shape=(6,))(inputs) if sparse else inputs
    h = keras.layers.Dense(4, activation="tanh")(h)
    if middle is not None:
        h = keras.layers.Lambda(middle, output_shape=(4,))(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))


def _sparse_rows():
    rng = np.random.default_rng(5)
    x = ((rng.random((16, 6)) < 0.4) * rng.normal(size=(16, 6))).astype(np.float32)
    indices = np.argwhere(x != 0).astype(np.int64)
    return x, tf.SparseTensor(indices, x[x != 0], x.shape), rng.integers(0, 3, 16)


def _fit_rows(model, x, y):
    make_private(model, l2_norm_clip=1e-3, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a pipeline tf_tempered did not build)
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    return model.get_weights()


# Before: a sparse model input left every check out (no batch tensor was found among the
# inputs): a batch centering after tf.sparse.to_dense trained, 6.1 C (probe H3, F1).
def test_a_sparse_input_is_checked_and_trains_as_the_dense_one():
    dense, sparse, y = _sparse_rows()
    with pytest.raises(UnsupportedLayerError, match="values computed from several examples"):
        _fit_rows(_sparse_input_model(True, middle=_batch_centered), sparse, y)
    for ours, reference in zip(_fit_rows(_sparse_input_model(True), sparse, y),
                               _fit_rows(_sparse_input_model(False), dense, y)):
        np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-7)
