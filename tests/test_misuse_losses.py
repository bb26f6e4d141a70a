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
"""Misuse tests, losses: the user's compile as written trains exactly, per example.

Each case compiles a loss the way a Keras user writes it and checks the engine's update
(noise 0) against a float64 per-example reference (dp_reference.py); a loss that
reduces over the batch is refused with a fix that fits it.
"""

import numpy as np
import pytest

from dp_reference import assert_update, engine_update, median_clip, per_example_reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import make_private
from tf_tempered.privacy.errors import ScalarLossError

pytestmark = pytest.mark.filterwarnings("ignore:noise_multiplier=0")

ROWS = 12


def _classifier(dtype, softmax=False):
    return keras.Sequential([
        keras.Input((5,), dtype=dtype),
        keras.layers.Dense(6, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, activation="softmax" if softmax else None, dtype=dtype)])


def _data(seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(ROWS, 5)).astype(np.float32), rng.integers(0, 3, ROWS)


def _sce(from_logits):
    def loss(y, p, model):
        del model
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y, p, from_logits=from_logits))
    return loss


# (loss as compiled, softmax output, the example's loss for the reference, scale)
_LOSSES = {
    "string": ("sparse_categorical_crossentropy", True, _sce(False), 1.0),
    "object-default-reduction": (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True), False, _sce(True), 1.0),
    "object-sum-reduction": (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum"), False,
        _sce(True), 1.0),
    "object-none-reduction": (
        keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none"), False,
        _sce(True), 1.0),
    "function-per-example": (
        lambda y, p: keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True),
        False, _sce(True), 1.0),
}


@pytest.mark.parametrize("case", sorted(_LOSSES))
def test_losses_as_users_write_them_train_exactly(case):
    loss, softmax, reference_loss, _ = _LOSSES[case]
    x, y = _data()
    build = lambda dtype: _classifier(dtype, softmax)  # noqa: E731
    weights = build("float32").get_weights()
    norms, reference = per_example_reference(build, weights, x, y, reference_loss)
    clip = median_clip(norms)
    model = build("float32")
    model.set_weights(weights)
    ours, history = engine_update(model, x, y, clip=clip, loss=loss)
    assert_update(ours, reference(clip))
    np.testing.assert_allclose(history["dp_clipped_fraction"][0], np.mean(norms > clip))


def _net(units, activation):
    return lambda dtype: keras.Sequential([
        keras.Input((5,), dtype=dtype), keras.layers.Dense(6, activation="tanh", dtype=dtype),
        keras.layers.Dense(units, activation=activation, dtype=dtype)])


def _targets(kind):
    rng = np.random.default_rng(2)
    return {"binary": rng.integers(0, 2, ROWS).astype(np.float32),
            "binary_column": rng.integers(0, 2, (ROWS, 1)).astype(np.float32),
            "scalar": rng.normal(size=ROWS).astype(np.float32),
            "pair": rng.normal(size=(ROWS, 2)).astype(np.float32),
            "one_hot": np.eye(3, dtype=np.float32)[rng.integers(0, 3, ROWS)],
            "binary_pair": rng.integers(0, 2, (ROWS, 2)).astype(np.float32),
            "signs_pair": 2.0 * rng.integers(0, 2, (ROWS, 2)).astype(np.float32) - 1.0}[kind]


# Keras' other loss names, with targets shaped as users pass them (a label vector for a
# one-unit output included): (name, output units, activation, targets, the example's loss).
_NAMED_LOSSES = {
    "binary_crossentropy-labels": ("binary_crossentropy", 1, "sigmoid", "binary",
                                   lambda y, p: keras.losses.binary_crossentropy(y[:, None], p)),
    "binary_crossentropy-column": ("binary_crossentropy", 1, "sigmoid", "binary_column",
                                   keras.losses.binary_crossentropy),
    "mse-vector": ("mse", 1, None, "scalar",
                   lambda y, p: keras.losses.mean_squared_error(y[:, None], p)),
    "mae": ("mae", 2, None, "pair", keras.losses.mean_absolute_error),
    "huber": ("huber", 2, None, "pair", lambda y, p: tf.reduce_mean(tf.where(
        tf.abs(y - p) <= 1.0, 0.5 * (y - p) ** 2, tf.abs(y - p) - 0.5), axis=-1)),
    "categorical_crossentropy": ("categorical_crossentropy", 3, "softmax", "one_hot",
                                 keras.losses.categorical_crossentropy),
    # Keras converts {0, 1} labels when the whole batch's are: refused as mixing before;
    # each example's own labels converted, as Keras does for one example.
    "hinge-binary": ("hinge", 2, None, "binary_pair", keras.losses.hinge),
    "hinge-signs": ("hinge", 2, None, "signs_pair", keras.losses.hinge),
    "squared_hinge-binary": ("squared_hinge", 2, None, "binary_pair",
                             keras.losses.squared_hinge),
    "Hinge()-signs": (keras.losses.Hinge(), 2, None, "signs_pair", keras.losses.hinge),
    "hinge-labels": ("hinge", 1, None, "binary",
                     lambda y, p: keras.losses.hinge(y[:, None], p)),
}


@pytest.mark.parametrize("case", sorted(_NAMED_LOSSES))
def test_other_loss_names_train_exactly(case):
    name, units, activation, targets, example_loss = _NAMED_LOSSES[case]
    x, y = _data()[0], _targets(targets)
    build = _net(units, activation)
    weights = build("float32").get_weights()
    norms, reference = per_example_reference(
        build, weights, x, y, lambda yy, pp, model: tf.reduce_mean(example_loss(yy, pp)))
    clip = median_clip(norms)
    model = build("float32")
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip, loss=name)
    assert_update(ours, reference(clip))


def test_a_sequence_loss_is_the_mean_over_the_example_positions():
    # [B, T] losses (a per-position classifier): the example's loss is their mean.
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(ROWS, 4, 5)).astype(np.float32), rng.integers(0, 3, (ROWS, 4))

    def build(dtype):
        return keras.Sequential([keras.Input((4, 5), dtype=dtype),
                                 keras.layers.Dense(3, dtype=dtype)])

    weights = build("float32").get_weights()
    norms, reference = per_example_reference(build, weights, x, y, _sce(True))
    clip = median_clip(norms)
    model = build("float32")
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip,
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert_update(ours, reference(clip))


def _classifier_and_regression(regression_name):
    """A builder of a model with two heads: "cls" (3 logits) and a 2-unit regression."""
    def build(dtype):
        inputs = keras.Input((5,), dtype=dtype)
        hidden = keras.layers.Dense(6, activation="tanh", dtype=dtype)(inputs)
        return keras.Model(inputs, {
            "cls": keras.layers.Dense(3, name="cls", dtype=dtype)(hidden),
            regression_name: keras.layers.Dense(2, name=regression_name, dtype=dtype)(hidden)})
    return build


def test_per_output_sample_weights_of_an_output_named_mask_train_exactly():
    # Before: any dict sample weight with a key "mask" was taken for a Poisson batch's info
    # dict and refused ("must be the Poisson-batch structure"), on arrays and tf.data, both
    # Kerases (probe U, F4): a segmentation head named "mask" beside a classifier.
    x, y = _data()
    rng = np.random.default_rng(3)
    weights_of = {"mask": rng.uniform(0.2, 2.0, ROWS).astype(np.float32),
                  "cls": rng.uniform(0.2, 2.0, ROWS).astype(np.float32)}
    targets = {"mask": x[:, :2] * 0.5, "cls": y}

    build = _classifier_and_regression("mask")
    def reference_loss(y_true, y_pred, model):
        del model
        cls = keras.losses.sparse_categorical_crossentropy(y_true["cls"], y_pred["cls"],
                                                           from_logits=True)
        mask = tf.reduce_mean(tf.square(y_true["mask"] - y_pred["mask"]), axis=-1)
        return tf.reduce_mean(y_true["w_cls"] * cls + y_true["w_mask"] * mask)

    weights = build("float32").get_weights()
    norms, reference = per_example_reference(
        build, weights, x, dict(targets, w_cls=weights_of["cls"], w_mask=weights_of["mask"]),
        reference_loss)
    clip = median_clip(norms)
    model = build("float32")
    model.set_weights(weights)
    ours, _ = engine_update(
        model, x, targets, clip=clip, sample_weight=weights_of,
        loss={"mask": "mse", "cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    assert_update(ours, reference(clip))
    poisson = make_private(build("float32"), l2_norm_clip=1.0, noise_multiplier=1.0)
    poisson.compile(optimizer=keras.optimizers.SGD(0.1), loss={
        "mask": "mse", "cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    poisson.fit(x, targets, sample_weight=weights_of, batch_size=8, verbose=0)
    batches = tf.data.Dataset.from_tensor_slices((x, targets, weights_of)).batch(8)
    with pytest.warns(UserWarning, match="did not build"):
        poisson.fit(batches, verbose=0)


def test_multi_output_losses_with_loss_weights_train_exactly():
    x, y = _data()
    targets = {"cls": y, "reg": x[:, :2] * 0.5}

    build = _classifier_and_regression("reg")
    def reference_loss(y_true, y_pred, model):
        del model
        cls = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y_true["cls"], y_pred["cls"], from_logits=True))
        reg = tf.reduce_mean(tf.square(y_true["reg"] - y_pred["reg"]))
        return cls + 0.25 * reg

    weights = build("float32").get_weights()
    norms, reference = per_example_reference(build, weights, x, targets, reference_loss)
    clip = median_clip(norms)
    model = build("float32")
    model.set_weights(weights)
    ours, history = engine_update(
        model, x, targets, clip=clip,
        loss={"cls": keras.losses.SparseCategoricalCrossentropy(from_logits=True),
              "reg": "mse"},
        loss_weights={"cls": 1.0, "reg": 0.25})
    assert_update(ours, reference(clip))
    assert "cls_loss" in history and "reg_loss" in history


def test_sample_weights_scale_each_example_before_clipping():
    x, y = _data()
    sample_weight = np.linspace(0.0, 2.0, ROWS).astype(np.float32)
    weights = _classifier("float32").get_weights()
    norms, reference = per_example_reference(_classifier, weights, x, y, _sce(True),
                                             sample_weight=sample_weight)
    clip = median_clip(norms)
    model = _classifier("float32")
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip, sample_weight=sample_weight,
                            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert_update(ours, reference(clip))
    # class_weight: the sample weights it stands for.
    classes = {0: 0.5, 1: 2.0, 2: 1.0}
    model = _classifier("float32")
    model.set_weights(weights)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, class_weight=classes, batch_size=ROWS, shuffle=False, verbose=0)
    _, reference_by_class = per_example_reference(
        _classifier, weights, x, y, _sce(True),
        sample_weight=np.array([classes[int(c)] for c in y], np.float32))
    assert_update([w.numpy() - b for w, b in zip(model.trainable_variables, weights)],
                  reference_by_class(clip))


def test_negative_weights_are_refused_naming_the_argument():
    x, y = _data()
    model = make_private(_classifier("float32"), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    before = model.get_weights()
    with pytest.raises(ValueError, match="sample_weight.*negative.*weights >= 0"):
        model.fit(x, y, sample_weight=-np.ones(ROWS), batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="negative"):
        model.fit(x, y, class_weight={0: 1.0, 1: -1.0, 2: 1.0}, batch_size=4, verbose=0)
    with pytest.raises(ValueError, match="negative or NaN entry.*finite weights >= 0"):
        model.fit(x, y, sample_weight=np.r_[np.ones(ROWS - 1), np.nan], batch_size=4, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_loss_reducing_over_the_batch_is_refused_with_a_fix_that_fits_it():
    x, y = _data()
    model = make_private(_classifier("float32"), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=lambda y_true, y_pred: tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)))
    _assert_refused_untrained(model, x, y, "one value for the whole batch.*reduce_mean.*axis=-1")


def _assert_refused_untrained(model, x, y, match):
    """fit raises a ValueError matching ``match`` before any update."""
    before = model.get_weights()
    with pytest.raises(ValueError, match=match):
        model.fit(x, y, batch_size=4, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's losses")
@pytest.mark.parametrize("loss", ["circle", "Circle()"])
def test_a_loss_comparing_the_batch_examples_is_refused(loss):
    # Keras 3's Circle loss scores each embedding against the batch's others: one
    # example's loss depends on all of them (trained silently before: removing one outlier
    # moved the clipped sum by 10 C).
    x, y = _data()
    model = make_private(_classifier("float32"), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="circle" if loss == "circle" else keras.losses.Circle())
    _assert_refused_untrained(model, x, y, "compares the batch's examples.*Fix: a loss computed")


# Before, for the strings: the fix given was a plain function's ("return the loss of each
# example..."), which a string cannot follow.
@pytest.mark.skipif(KERAS_MAJOR == 2, reason="Keras 3's losses")
@pytest.mark.parametrize("loss, name", [("Dice()", "Dice"), ("dice", "Dice"),
                                        ("tversky", "Tversky")])
def test_a_dice_loss_over_every_axis_is_refused_naming_its_axis(loss, name):
    x, y = _data()
    model = make_private(_classifier("float32", softmax=True), l2_norm_clip=1.0,
                         noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=keras.losses.Dice() if loss == "Dice()" else loss)
    with pytest.raises(ValueError, match=rf"whole batch.*keras.losses.{name}\(axis=...\) "
                       "with the non-batch"):
        model.fit(x, keras.utils.to_categorical(y, 3), batch_size=4, verbose=0)
    model.compile(optimizer="sgd", loss=keras.losses.Dice(axis=1))  # the fix: it trains
    model.fit(x, keras.utils.to_categorical(y, 3), batch_size=4, verbose=0)


class ScalarLossModel(keras.Sequential):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        del x, sample_weight, kwargs
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            y, y_pred, from_logits=True))


def test_a_compute_loss_override_returning_a_scalar_is_refused():
    x, y = _data()
    model = ScalarLossModel([keras.Input((5,)), keras.layers.Dense(3)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    with pytest.raises(ValueError, match="compute_loss.*one loss per example"):
        model.fit(x, y, batch_size=4, verbose=0)


class PerExampleLossModel(keras.Sequential):
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        del x, sample_weight, kwargs
        return keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)


def test_a_compute_loss_override_trains_exactly_without_a_compiled_loss():
    # Before: refused, "compiled without a loss. Fix: compile with one" (the per-output loss
    # trackers were looked up in a container compile(loss=None) leaves none of; probe R).
    x, y = _data()

    def build(dtype="float32"):
        return PerExampleLossModel([keras.Input((5,), dtype=dtype),
                                    keras.layers.Dense(4, activation="tanh", dtype=dtype),
                                    keras.layers.Dense(3, dtype=dtype)])

    weights = build().get_weights()
    norms, reference = per_example_reference(
        build, weights, x, y, lambda y_i, pred, model: keras.losses.sparse_categorical_crossentropy(
            y_i, pred, from_logits=True))
    model = build()
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=median_clip(norms), loss=None)
    assert_update(ours, reference(median_clip(norms)))


def test_the_epoch_loss_leaves_out_the_examples_counted_nonfinite():
    x, y = _data()
    x[3] = np.nan
    model = _classifier("float32")
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    expected = loss(np.delete(y, 3), model(np.delete(x, 3, axis=0))).numpy()
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss=loss)
    history = model.fit(x, y, batch_size=ROWS, shuffle=False, verbose=0).history
    assert history["dp_nonfinite"] == [1.0]
    np.testing.assert_allclose(history["loss"][0], expected, rtol=1e-5)


def _poisson_positions_update(x, y, mask, *, clip, expected, position_weight=None):
    """The engine's update (noise 0, SGD at lr 1) of one Poisson batch of a per-position
    classifier: rows with mask 0 are padding; ``position_weight`` the user's [rows, T]."""
    model = _per_position("float32")
    model.set_weights(_INITIAL)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [w.numpy() for w in model.trainable_variables]
    info = {"mask": tf.constant(mask, tf.float32), "expected_batch_size": tf.constant(expected)}
    if position_weight is not None:
        info["sample_weight"] = tf.constant(position_weight)
    model.fit(tf.data.Dataset.from_tensors((x, y, info)), verbose=0)
    return [w.numpy() - b for w, b in zip(model.trainable_variables, before)]


def _per_position(dtype):
    return keras.Sequential([keras.Input((_POSITIONS, 5), dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


_POSITIONS = 8  # as many as the padded batch's rows: a weight broadcast along the wrong axis fits
_INITIAL = [np.array([[0.5, -0.3, 0.1], [0.2, 0.4, -0.6], [-0.1, 0.3, 0.2], [0.7, -0.2, 0.0],
                      [0.0, 0.1, -0.4]], np.float32), np.array([0.1, -0.1, 0.0], np.float32)]


def _positions_reference(x, y, real, position_weight, clip, expected):
    """Σ over the real rows of clip(∇ mean_t w_it · ℓ_it) / expected, in float64 (some
    of the rows clipped, some not)."""
    model = _per_position("float64")
    model.set_weights([w.astype(np.float64) for w in _INITIAL])
    total, norms = [np.zeros(v.shape) for v in model.trainable_variables], []
    for i in real:
        with tf.GradientTape() as tape:
            losses = keras.losses.sparse_categorical_crossentropy(
                y[i:i + 1], model(x[i:i + 1].astype(np.float64)), from_logits=True)
            loss = tf.reduce_mean(losses * position_weight[i])
        grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
        norms.append(np.sqrt(sum(np.sum(g ** 2) for g in grads)))
        total = [t + min(1.0, clip / norms[-1]) * g for t, g in zip(total, grads)]
    assert 0 < np.mean(np.array(norms) > clip) < 1, norms
    return [-t / expected for t in total]


@pytest.mark.filterwarnings("ignore:fit on a pipeline")
@pytest.mark.parametrize("user_weights", [False, True], ids=["mask-only", "per-position-weights"])
def test_per_position_labels_on_poisson_batches_train_exactly(user_weights):
    # [B, T] losses (per-position labels, as a tagger or a language model has) against a
    # Poisson batch's [B] mask: Keras 3's loss refused the [B] weight (a crash on fit's
    # default path), and a user's [B, T] weight times the mask broadcast the mask along
    # T when T equals the padded rows: padding rows trained, real positions dropped.
    rng = np.random.default_rng(5)
    rows, real = _POSITIONS, [0, 1, 2, 4, 5]
    x = rng.normal(size=(rows, _POSITIONS, 5)).astype(np.float32)
    y = rng.integers(0, 3, (rows, _POSITIONS))
    mask = np.isin(np.arange(rows), real).astype(np.float32)
    weight = (rng.uniform(0.0, 2.0, (rows, _POSITIONS)).astype(np.float32) if user_weights
              else np.ones((rows, _POSITIONS), np.float32))
    clip, expected = 1.0, 6.0
    ours = _poisson_positions_update(x, y, mask, clip=clip, expected=expected,
                                     position_weight=weight if user_weights else None)
    reference = _positions_reference(x, y, real, weight, clip, expected)
    assert_update(ours, reference)


def _pairs_of_examples(y_true, y_pred):
    """InfoNCE-style: each example's logits against every example's, [B, B] by broadcasting."""
    logits = tf.reduce_sum(y_pred[:, None, :] * y_pred[None, :, :], axis=-1)
    return keras.losses.sparse_categorical_crossentropy(
        tf.range(tf.shape(y_pred)[0]), logits, from_logits=True)


def _labels_against_a_column(y_true, y_pred):
    """Labels [B] against predictions [B, 1]: broadcast to [B, B], every pair of examples."""
    return tf.reduce_mean(tf.square(tf.cast(y_true, tf.float32) - y_pred[:, :1]), axis=-1)


def _against_the_first_example(y_true, y_pred):
    return tf.reduce_mean(tf.square(y_pred - tf.gather(y_pred, [0])), axis=-1)


def _ranknet(y_true, y_pred):
    score = y_pred[:, :1]
    return tf.reduce_mean(tf.nn.softplus(score - tf.transpose(score)), axis=-1)


# Before: each trained silently; one example moved the clipped sum by up to 4.6 C (a probe).
@pytest.mark.parametrize("loss", [
    _pairs_of_examples, _against_the_first_example, _ranknet,
    pytest.param(_labels_against_a_column, marks=pytest.mark.skipif(
        KERAS_MAJOR == 2, reason="tf-keras gives the function labels [B, 1]: no pairs"))])
def test_a_loss_pairing_the_batch_s_examples_by_broadcasting_is_refused(loss):
    x, y = _data()
    model = make_private(_classifier("float32"), l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=loss)
    _assert_refused_untrained(model, x, y, "The per-example losses are computed from values "
                              "computed from several examples")


def _per_token(y_true, y_pred):
    """A per-token loss flattened to [B·T], as language-model code often writes it."""
    return tf.reshape(keras.losses.sparse_categorical_crossentropy(y_true, y_pred,
                                                                   from_logits=True), [-1])


# Before: with the batch size known only while the step ran (tf.data without drop_remainder,
# arrays whose last batch is short), each token was clipped as an example, silently.
@pytest.mark.parametrize("data", ["tf.data", "arrays"])
def test_a_loss_with_a_row_per_token_is_refused_whatever_the_batch_size(data):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(10, 4, 5)).astype(np.float32), rng.integers(0, 3, (10, 4))
    model = make_private(keras.Sequential([keras.Input((4, 5)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0, sampling="shuffle")
    model.compile(optimizer="sgd", loss=_per_token)
    before = model.get_weights()
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"another number of rows than "
                       r"the batch has examples.*Fix: return the loss of each example"):
        if data == "tf.data":
            model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), verbose=0)
        else:
            model.fit(x, y, batch_size=4, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


# Before: refused by TF's shape error inside Keras' loss ("Dimensions must be equal, but are
# 156 and 26"), naming no fix: the Poisson mask weighed [B·T] rows.
def test_a_loss_with_a_row_per_token_under_poisson_sampling_is_refused_naming_the_fix():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 4, 5)).astype(np.float32), rng.integers(0, 3, (32, 4))
    model = make_private(keras.Sequential([keras.Input((4, 5)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=_per_token)
    before = model.get_weights()
    with pytest.raises(ScalarLossError, match=r"rows, not one per example.*Fix: return the "
                       "loss of each example"):
        model.fit(x, y, batch_size=8, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def _squeezed_squared_error(y_true, y_pred):
    """tf.squeeze without an axis: [rows] per batch, a scalar for a batch of one."""
    return tf.square(tf.squeeze(y_true) - tf.squeeze(y_pred))


# Before (tf-keras; plain Keras 3 fails on this loss itself): the last batch of one row made
# the loss's rank unknown while tracing, and fit failed with TypeError ("'NoneType' object
# cannot be interpreted as an integer") naming nothing.
@pytest.mark.skipif(KERAS_MAJOR == 3, reason="plain Keras 3 fails on this loss too")
def test_a_loss_squeezed_without_an_axis_trains_exactly_on_a_last_batch_of_one_row():
    rng = np.random.default_rng(9)
    x, y = rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=(4, 1)).astype(np.float32)

    def build(dtype="float32"):
        return keras.Sequential([keras.Input((5,), dtype=dtype),
                                 keras.layers.Dense(1, dtype=dtype)])

    def one_example_loss(y_true, y_pred, model):
        return _squeezed_squared_error(y_true, y_pred)

    weights, clip = build().get_weights(), 0.5
    expected = [w.astype(np.float64) for w in weights]
    for rows in (slice(0, 3), slice(3, 4)):  # batch_size=3: a last batch of one row
        _, reference = per_example_reference(build, [w.astype(np.float32) for w in expected],
                                             x[rows], y[rows], one_example_loss)
        expected = [w + u for w, u in zip(expected, reference(clip))]
    model = build()
    model.set_weights(weights)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=_squeezed_squared_error)
    model.fit(x, y, batch_size=3, shuffle=False, verbose=0)
    assert_update([w - w0 for w, w0 in zip(model.get_weights(), weights)],
                  [e - w0 for e, w0 in zip(expected, weights)])
