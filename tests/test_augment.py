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
"""Augmentation multiplicity: the data side (tf_tempered.augment) and the engine's
per-example clipping of the mean over an example's copies (privacy/microbatching.py)."""

import numpy as np
import pytest

import dp_reference
from tf_tempered import augment
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private, microbatching

K = 3


def _cnn(dtype):
    return keras.Sequential([
        keras.Input((6, 6, 1), dtype=dtype),
        keras.layers.Conv2D(3, 3, activation="tanh", dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(4, dtype=dtype),
    ])


def _copies(n, k=K, seed=0):
    """n examples, each as k different (augmented) rows, consecutive."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n * k, 6, 6, 1)).astype("float32")
    y = np.repeat(rng.integers(0, 4, size=n), k)
    return x, y


@pytest.mark.parametrize("static_batch", [True, False])
def test_engine_clips_the_mean_over_each_examples_copies(static_batch):
    x, y = _copies(8)
    # Reference: one float64 tape per example over its K rows (mean loss), clipped.
    dp_reference.assert_engine_matches_reference(
        dp_reference.seeded(_cnn), x, y, static_batch=static_batch, augmentation_multiplicity=K)


def test_microbatches_of_several_examples_with_copies():
    x, y = _copies(8)
    dp_reference.assert_engine_matches_reference(
        dp_reference.seeded(_cnn), x, y, num_microbatches=4, static_batch=True,
        augmentation_multiplicity=K)


def test_poisson_batch_with_copies_leaves_padding_out_and_divides_by_expected_batch():
    build = dp_reference.seeded(_cnn)
    x_real, y_real = _copies(3)
    pad = 2 * K  # two padded examples: zero rows, mask 0
    x = np.concatenate([x_real, np.zeros((pad, 6, 6, 1), "float32")])
    y = np.concatenate([y_real, np.zeros(pad, y_real.dtype)])
    mask = np.concatenate([np.ones(len(x_real)), np.zeros(pad)]).astype("float32")
    expected = 4.0
    weights = build("float32").get_weights()
    norms, reference = dp_reference._reference(build, weights, x_real, y_real, 3)
    clip = float(np.mean(np.sort(norms)[:2]))  # between the two smallest: 2 of 3 clipped
    want = [r * 3 / expected for r in reference(clip)]  # Σ clipped / expected batch size

    model = build("float32")
    model.set_weights(weights)
    make_private(model, augmentation_multiplicity=K)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0,
                                                learning_rate=1.0), loss=dp_reference.LOSS)
    before = [v.numpy() for v in model.trainable_variables]
    data = augment.declare_copies(tf.data.Dataset.from_tensors(
        (x, y, {"mask": mask, "expected_batch_size": np.float32(expected)})), multiplicity=K)
    history = model.fit(data, verbose=0).history
    got = [v.numpy() - b for v, b in zip(model.trainable_variables, before)]
    # Two of the 3 real examples are clipped; padding is not counted.
    np.testing.assert_allclose(history["dp_clipped_fraction"][0], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(history["dp_grad_norm"][0], norms.mean(), rtol=1e-4)
    scale = max(np.abs(w).max() for w in want)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale)


def test_rows_not_a_multiple_of_the_multiplicity_are_refused():
    model = make_private(_cnn("float32"), augmentation_multiplicity=K)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=dp_reference.LOSS)
    x, y = _copies(3)
    with pytest.warns(UserWarning, match="did not build"), pytest.raises(
            ValueError, match=r"augmentation_multiplicity=3 does not divide the 7 "
                              r"rows.*augmult_batches"):
        model.fit(augment.declare_copies(tf.data.Dataset.from_tensors((x[:7], y[:7])),
                                         multiplicity=K), verbose=0)
    # Arrays hold examples: fit cannot sample them into each example's copies.
    with pytest.raises(ValueError, match=r"augmentation_multiplicity=3 needs batches.*"
                                         r"augmult_batches\(.*poisson_batches"):
        model.fit(x[:6], y[:6], batch_size=6, verbose=0)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_multiplicity_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match=r"augmentation_multiplicity=.* is invalid"):
        make_private(_cnn("float32"), augmentation_multiplicity=bad)


def test_microbatch_mask_is_the_examples_mask():
    mask = tf.constant([1, 1, 1, 1, 0, 0], tf.float32)
    np.testing.assert_array_equal(microbatching.microbatch_mask(mask, 3).numpy(), [1, 1, 0])


def test_random_shift_flip_is_a_zero_filled_shift_within_range():
    rng = np.random.default_rng(1)
    images = rng.uniform(0.5, 1.0, size=(64, 5, 5, 2)).astype("float32")
    out = augment.random_shift_flip(images, max_shift=1, flip=True, seed=[3, 4]).numpy()

    def shifted(img, dy, dx, mirror):
        img = img[:, ::-1] if mirror else img
        padded = np.pad(img, [(1, 1), (1, 1), (0, 0)])
        return padded[1 + dy:6 + dy, 1 + dx:6 + dx]

    seen = set()
    for img, o in zip(images, out):
        matches = [(dy, dx, m) for dy in (-1, 0, 1) for dx in (-1, 0, 1) for m in (False, True)
                   if np.array_equal(shifted(img, dy, dx, m), o)]
        assert len(matches) == 1, matches  # exactly one shift/flip explains each output
        seen.add(matches[0])
    assert len(seen) > 9  # the 18 combinations are drawn, not one fixed shift


def test_augmult_batches_repeats_rows_masks_and_keeps_the_expected_batch():
    x = np.arange(4 * 4 * 4, dtype="float32").reshape(4, 4, 4, 1)
    y = np.array([5, 6, 7, 8])
    info = {"mask": np.array([1.0, 0.0, 1.0, 1.0], "float32"),
            "expected_batch_size": np.float32(2.5)}
    ds = tf.data.Dataset.from_tensors((x, y, info))
    xb, yb, wb = next(iter(augment.augmult_batches(ds, multiplicity=2, seed=7)))
    np.testing.assert_array_equal(yb.numpy(), [5, 5, 6, 6, 7, 7, 8, 8])
    np.testing.assert_array_equal(wb["mask"].numpy(), [1, 1, 0, 0, 1, 1, 1, 1])
    assert float(wb["expected_batch_size"]) == 2.5
    # max_shift=0, no flip: the copies are the example itself.
    np.testing.assert_array_equal(xb.numpy(), np.repeat(x, 2, axis=0))


def test_augmentations_are_fresh_each_epoch():
    x = np.random.default_rng(0).uniform(size=(16, 6, 6, 1)).astype("float32")
    ds = augment.augmult_batches(tf.data.Dataset.from_tensors((x, np.zeros(16))),
                                 multiplicity=2, max_shift=2, seed=5)
    first, second = (next(iter(ds))[0].numpy() for _ in range(2))
    assert not np.array_equal(first, second)


@pytest.mark.parametrize("kwargs, name", [({"multiplicity": 0}, "multiplicity"),
                                          ({"multiplicity": 2, "max_shift": -1}, "max_shift")])
def test_augmult_batches_validates(kwargs, name):
    ds = tf.data.Dataset.from_tensors((np.zeros((2, 4, 4, 1), "float32"), np.zeros(2)))
    with pytest.raises(ValueError, match=rf"^{name}=.* is invalid"):
        augment.augmult_batches(ds, **kwargs)


# keras3_suite: the train script sits above make_private and fit, which the Keras 2 suite
# tests directly (as tests/test_train.py).
@pytest.mark.keras3_suite
def test_train_script_trains_on_k_copies_with_the_same_epsilon():
    from tf_tempered.experiments import common, privacy_plan, train, train_data
    base = common.TrainConfig(dataset="digits", num_train=256, num_test=64, batch_size=32,
                              epochs=1, learning_rate=0.5, seed=0, insecure_dp_seed=1)
    plain = train.run_training(base, verbose=0)
    config = base.replace(augmult=3, augment_shift=1, momentum=0.5)
    plan = privacy_plan.plan_privacy(config, 256)
    batch = next(iter(train_data.training_batches(
        config, plan, np.zeros((256, 8, 8, 1), "float32"), np.zeros(256))))
    assert batch[0].shape[0] % 3 == 0 and float(tf.reduce_sum(batch[2]["mask"])) % 3 == 0
    result = train.run_training(config, verbose=0)
    assert result["flags"]["augmult"] == 3
    assert result["epsilon"] == pytest.approx(plain["epsilon"], rel=1e-12)  # no privacy cost
    assert 0.0 <= result["test_accuracy"] <= 1.0


@pytest.mark.parametrize("changes, flag", [({"augmult": 0}, "augmult"),
                                           ({"momentum": 1.0}, "momentum"),
                                           ({"momentum": 0.9, "optimizer": "adam"}, "momentum"),
                                           ({"augment_flip": True}, "augment_flip"),
                                           ({"augmult": 2, "augment_shift": -1}, "augment_shift")])
def test_train_script_validates_augmentation_flags(changes, flag):
    from tf_tempered.experiments import common
    with pytest.raises(common.ConfigError, match=rf"--{flag}"):
        common.validate_config(common.TrainConfig(dataset="digits").replace(**changes))


def test_pick_variants_takes_each_copy_from_its_own_examples_variants():
    x = tf.constant(np.arange(4 * 5, dtype="float32").reshape(4, 5))  # 4 examples, 5 variants
    copies = augment.pick_variants(x, 6, seed=[3, 4]).numpy()
    assert copies.shape == (24,) and copies.dtype == np.float32
    for i in range(4):
        assert set(copies[i * 6:(i + 1) * 6]) <= set(range(i * 5, i * 5 + 5))
    many = augment.pick_variants(tf.zeros([2000, 5]) + tf.range(5.0), 3, seed=[1, 2]).numpy()
    counts = np.bincount(many.astype(int), minlength=5)
    assert (np.abs(counts / len(many) - 0.2) < 0.02).all()  # uniform over the variants
    # Other shapes and float16 storage: [B, V, h, w, c] -> [B·K, h, w, c] float32.
    images = tf.cast(tf.reshape(tf.range(2 * 3 * 4, dtype=tf.float32), [2, 3, 2, 2, 1]),
                     tf.float16)
    assert augment.pick_variants(images, 2, seed=[0, 0]).shape == (4, 2, 2, 1)


def test_augmult_batches_with_copies_of_precomputed_variants():
    x = np.stack([np.full((3, 2, 2, 1), i, "float32") for i in range(4)])  # [4, 3 variants, ...]
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(4))).batch(4)
    bx, by = next(iter(augment.augmult_batches(ds, multiplicity=2, copies=augment.pick_variants,
                                               seed=0)))
    assert bx.shape == (8, 2, 2, 1) and by.numpy().tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    np.testing.assert_array_equal(bx.numpy()[:, 0, 0, 0], by.numpy())


# keras3_suite: the train script sits above make_private and fit, which the Keras 2 suite
# tests directly (as tests/test_train.py).
@pytest.mark.keras3_suite
def test_train_script_augments_scatternet_features_with_shifted_images():
    pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")
    from tf_tempered.experiments import (  # pylint: disable=g-import-not-at-top
        common, privacy_plan, train, train_data)
    base = common.TrainConfig(dataset="digits", features="scatternet", activation="tanh",
                              num_train=256, num_test=64, batch_size=32, epochs=1,
                              learning_rate=0.5, l2_norm_clip=0.1, seed=0, insecure_dp_seed=1)
    plain = train.run_training(base, verbose=0)
    config = base.replace(augmult=3, augment_shift=1)
    variants = np.zeros((256, 9, 2, 2, 81), "float16")
    plan = privacy_plan.plan_privacy(config, 256)
    x, _, info = next(iter(train_data.training_batches(config, plan, variants, np.zeros(256))))
    assert x.shape[1:] == (2, 2, 81) and x.dtype == tf.float32
    assert x.shape[0] == info["mask"].shape[0] and x.shape[0] % 3 == 0
    result = train.run_training(config, verbose=0)
    assert result["epsilon"] == pytest.approx(plain["epsilon"], rel=1e-12)  # no privacy cost
    assert 0.0 <= result["test_accuracy"] <= 1.0


# keras3_suite: the train script sits above make_private and fit, which the Keras 2 suite
# tests directly (as tests/test_train.py).
@pytest.mark.keras3_suite
def test_train_script_mirrors_scatternet_features_with_augment_flip(monkeypatch):
    """--augment_flip with --features=scatternet: the copies pick among the features of the
    plain and the mirrored images (here without shifts), at no privacy cost."""
    pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")
    from tf_tempered import data, scatternet  # pylint: disable=g-import-not-at-top
    from tf_tempered.experiments import (  # pylint: disable=g-import-not-at-top
        common, train, train_data)
    base = common.TrainConfig(dataset="digits", features="scatternet", activation="tanh",
                              num_train=128, num_test=32, batch_size=32, epochs=1,
                              learning_rate=0.5, l2_norm_clip=0.1, seed=0, insecure_dp_seed=1)
    config = common.validate_config(base.replace(augmult=2, augment_shift=0, augment_flip=True))
    seen = {}
    real = train_data.training_batches

    def spy(config, plan, x, y, strategy):
        seen["x"] = x
        batches = real(config, plan, x, y, strategy)
        seen["batch"] = next(iter(batches))
        return batches

    monkeypatch.setattr(train_data, "training_batches", spy)
    result = train.run_training(config, verbose=0)
    x = seen["x"]
    assert isinstance(x, scatternet.ShiftedFeatures) and x.shape[1] == 2
    images = data.load("digits", num_train=128, num_test=32).x_train
    mirrored = scatternet.scattering_features(np.ascontiguousarray(images[:, :, ::-1]))
    np.testing.assert_allclose(np.asarray(x[:, 1]), mirrored.astype(np.float16), rtol=0, atol=0)
    batch_x, batch_y, info = seen["batch"]
    variants = np.asarray(x).astype(np.float32)  # [128, 2, ...]
    keep = info["mask"].numpy() > 0
    assert keep.sum() > 0 and len(batch_y) % 2 == 0
    for features in batch_x.numpy()[keep]:
        assert any(np.array_equal(features, v) for v in variants.reshape(-1, *variants.shape[2:]))
    plain = train.run_training(base, verbose=0)
    assert result["epsilon"] == pytest.approx(plain["epsilon"], rel=1e-12)  # no privacy cost
    assert 0.0 <= result["test_accuracy"] <= 1.0


def test_shifted_scatternet_features_follow_a_middle_validation_fold(monkeypatch):
    """--validation_fold: the augmented features of training example i are those of its image."""
    pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")
    from tf_tempered import data, scatternet  # pylint: disable=g-import-not-at-top
    from tf_tempered.experiments import (  # pylint: disable=g-import-not-at-top
        common, privacy_plan, train, train_data)
    config = common.TrainConfig(dataset="digits", features="scatternet", activation="tanh",
                                num_train=192, num_test=32, batch_size=32, epochs=1,
                                learning_rate=0.5, l2_norm_clip=0.1, seed=0, augmult=2,
                                augment_shift=1, validation_size=64, validation_fold=1)
    seen = {}
    real = train_data.training_batches

    def spy(config, plan, x, y, strategy):
        seen["x"], seen["y"] = x, y
        return real(config, plan, x, y, strategy)

    monkeypatch.setattr(train_data, "training_batches", spy)
    result = train.run_training(config, verbose=0)
    ds = data.load("digits", num_train=192, num_test=32)
    rest = np.r_[0:64, 128:192]  # fold 1 of 64 held out
    np.testing.assert_array_equal(seen["y"], ds.y_train[rest])
    unshifted = scatternet.scattering_features(ds.x_train[rest])  # variant 4: shift (0, 0)
    np.testing.assert_allclose(seen["x"][:, 4], unshifted.astype(np.float16), rtol=0, atol=0)
    assert result["dataset"]["num_train"] == 128


def _fit_refused(model_multiplicity, data, match):
    model = make_private(_cnn("float32"), augmentation_multiplicity=model_multiplicity)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                learning_rate=0.1), loss=dp_reference.LOSS)
    before = model.get_weights()
    with pytest.raises(ValueError, match=match):
        model.fit(data, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


# Before: each trained silently: K copies of one example clipped apart (it moved the clipped
# sum by K·C against noise for C), or K different examples clipped together as one with the
# per-example ε logged (a probe: 7.08 logged where num_microbatches' accounting gives 16.5).
def test_batches_whose_copies_differ_from_the_model_s_multiplicity_are_refused():
    x, y = _copies(4)
    copies = augment.augmult_batches(tf.data.Dataset.from_tensors((x[::K], y[::K])),
                                     multiplicity=K, seed=0)
    _fit_refused(None, copies, r"Batches holding 3 copies of each example.*Fix: "
                 r"make_private\(model, augmentation_multiplicity=3\)")
    _fit_refused(2, copies, r"made private with augmentation_multiplicity=2: ")
    plain = tf.data.Dataset.from_tensors((x, y))
    _fit_refused(K, plain, r"augmentation_multiplicity=3: the DP step clips each 3 consecutive "
                 r"rows.*Fix: fit on augmult_batches.*declare_copies")


def _update_on(data, multiplicity):
    model = make_private(_cnn("float32"), augmentation_multiplicity=multiplicity)
    model.set_weights(_cnn_weights())
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.01, noise_multiplier=0.0,
                                                learning_rate=1.0), loss=dp_reference.LOSS)
    before = model.get_weights()
    model.fit(data, verbose=0)
    return [a - b for a, b in zip(model.get_weights(), before)]


def _cnn_weights():
    keras.utils.set_random_seed(3)
    return _cnn("float32").get_weights()


# Before: augmult_batches of augmult batches declared the outer multiplicity only (2 for 4
# copies): augmentation_multiplicity=4 was refused, naming 2, and 2 trained each example as
# two groups, moving the clipped sum by 2C against noise for C at the logged ε (probe Y).
@pytest.mark.filterwarnings("ignore:noise_multiplier=0")
def test_augmult_batches_of_augmult_batches_hold_the_product_of_the_copies():
    x, y = _copies(4)
    batch = tf.data.Dataset.from_tensors((x[::K], y[::K]))
    nested = augment.augmult_batches(augment.augmult_batches(batch, multiplicity=2, seed=0),
                                     multiplicity=2, seed=0)
    _fit_refused(2, nested, r"Batches holding 4 copies of each example.*Fix: "
                 r"make_private\(model, augmentation_multiplicity=4\)")
    once = augment.augmult_batches(batch, multiplicity=4, seed=0)  # the same rows
    reference = _update_on(once, 4)
    assert max(np.abs(r).max() for r in reference) > 1e-4
    for ours, expected in zip(_update_on(nested, 4), reference):
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-7)


# Before: an unbatch and rebatch of augmult batches trained a K = 1 model silently, each
# example's copies clipped apart (a probe: ε 10.7 logged for 25.9 spent).
def test_augmult_batches_regrouped_are_refused():
    x, y = _copies(4)
    copies = augment.augmult_batches(tf.data.Dataset.from_tensors((x[::K], y[::K])),
                                     multiplicity=K, seed=0)
    _fit_refused(None, copies.unbatch().batch(6), r"regroups their rows.*Fix: apply "
                 r"augmult_batches last")
