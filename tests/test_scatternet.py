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
"""ScatterNet features (layout, values, cache) and the ScatterNet CNN under DP-SGD."""

import pathlib

import numpy as np
import pytest

from tf_tempered import make_private, scatternet
from tf_tempered._compat import keras, tf
from tf_tempered.experiments import common, model_builders

kymatio_frontend = pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")


def _images(n=3, size=28, channels=None, seed=0):
    shape = (n, size, size) if channels is None else (n, size, size, channels)
    return np.random.default_rng(seed).random(shape, dtype=np.float32)


def test_layout_and_values_match_kymatio():
    x = _images(2, channels=2)
    got = scatternet.scattering_features(x, cache=False)
    assert got.shape == (2, 7, 7, 2 * 81) and got.dtype == np.float32
    ref = kymatio_frontend.ScatteringNumPy2D(J=2, shape=(28, 28), L=8)(
        np.moveaxis(x, -1, 1))  # [N, C, 81, 7, 7]
    # The same transform, computed in another order: equal to float32 rounding.
    for c in range(2):
        for k in (0, 1, 16, 17, 80):
            np.testing.assert_allclose(got[..., c * 81 + k], ref[:, c, k], rtol=1e-5,
                                       atol=1e-6)
    np.testing.assert_allclose(got, np.moveaxis(ref, 2, -1).transpose(0, 2, 3, 1, 4).reshape(
        got.shape), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("J, L, shape", [(1, 2, (8, 8)), (2, 4, (16, 12)), (3, 8, (32, 32)),
                                         (2, 6, (20, 28))])
def test_every_coefficient_matches_kymatio(J, L, shape):
    x = np.random.default_rng(J + L).random((3,) + shape, dtype=np.float32)
    got = scatternet.scattering_features(x, J=J, L=L, cache=False)
    ref = kymatio_frontend.ScatteringNumPy2D(J=J, shape=shape, L=L)(x)  # [N, K, h, w]
    assert got.shape == (3, shape[0] // 2 ** J, shape[1] // 2 ** J, scatternet.num_channels(J, L))
    np.testing.assert_allclose(got, np.moveaxis(ref, 1, -1), rtol=1e-5, atol=1e-6)


def test_constant_image_closed_form():
    # A constant image: S0 = c · Σφ = c (φ sums to 1), every wavelet channel 0 (zero mean).
    x = np.full((1, 16, 16), 0.7, np.float32)
    got = scatternet.scattering_features(x, J=2, L=4, cache=False)
    assert got.shape == (1, 4, 4, scatternet.num_channels(2, 4)) == (1, 4, 4, 25)
    np.testing.assert_allclose(got[..., 0], 0.7, rtol=1e-4)
    np.testing.assert_allclose(got[..., 1:], 0.0, atol=1e-6)


def test_positive_homogeneity_and_order0_linearity():
    # Convolutions are linear and |.| positively homogeneous: S(a x) = a S(x), a >= 0;
    # S0 is a convolution alone: S0(x + y) = S0(x) + S0(y).
    x, y = _images(2, 16, seed=1), _images(2, 16, seed=2)
    s = lambda v: scatternet.scattering_features(v, J=2, L=4, cache=False)  # noqa: E731
    np.testing.assert_allclose(s(3.0 * x), 3.0 * s(x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s(x + y)[..., 0], s(x)[..., 0] + s(y)[..., 0], rtol=1e-5,
                               atol=1e-6)


def test_cache_is_keyed_by_content(tmp_path):
    x = _images(2, 16)
    first = scatternet.scattering_features(x, J=2, L=4, cache_dir=tmp_path)
    files = sorted(tmp_path.iterdir())
    assert len(files) == 1 and "J2_L4" in files[0].name and "2x16x16x1" in files[0].name
    # scat_J2_L4_kymatio<version>_2x16x16x1_<digest>.npy (e2d2c30 renamed it by accident)
    version = scatternet.transform.kymatio_modules()[2]
    assert files[0].name.startswith(f"scat_J2_L4_kymatio{version}_2x16x16x1_")
    np.testing.assert_array_equal(np.load(files[0]), first)
    again = scatternet.scattering_features(x, J=2, L=4, cache_dir=tmp_path)
    np.testing.assert_array_equal(again, first)
    assert sorted(tmp_path.iterdir()) == files
    x2 = x.copy()
    x2[1, 3, 5] += 0.5  # same shape, other pixels: another key, fresh values
    other = scatternet.scattering_features(x2, J=2, L=4, cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 2
    np.testing.assert_array_equal(other[0], first[0])
    assert not np.array_equal(other[1], first[1])


def test_memory_mapped_features_read_the_cache_file(tmp_path):
    x = _images(3, 16)
    in_memory = scatternet.scattering_features(x, J=2, L=4, cache=False)
    computed = scatternet.scattering_features(x, J=2, L=4, cache_dir=tmp_path, mmap_mode="r")
    cached = scatternet.scattering_features(x, J=2, L=4, cache_dir=tmp_path, mmap_mode="r")
    for mapped in (computed, cached):  # written then mapped; mapped from the cache
        assert isinstance(mapped, np.memmap) and not mapped.flags.writeable
        assert pathlib.Path(mapped.filename).parent == tmp_path
        np.testing.assert_array_equal(mapped, in_memory)
    with pytest.raises(ValueError, match="mmap_mode='w' is invalid"):
        scatternet.scattering_features(x, J=2, L=4, cache_dir=tmp_path, mmap_mode="w")
    with pytest.raises(ValueError, match="needs cache=True"):
        scatternet.scattering_features(x, J=2, L=4, cache=False, mmap_mode="r")


def test_bad_arguments_name_the_fix():
    with pytest.raises(ValueError, match="divisible by 2\\^J=4"):
        scatternet.scattering_features(_images(1, 18), cache=False)
    with pytest.raises(ValueError, match="float array"):
        scatternet.scattering_features(np.zeros((1, 16, 16), np.uint8), cache=False)
    with pytest.raises(ValueError, match="groups=10 is invalid"):
        scatternet.scatternet_cnn("tanh", groups=10)


def test_cnn_layout_and_group_norm_has_no_weights():
    model = scatternet.scatternet_cnn("tanh")
    norm = model.get_layer("group_norm")
    assert norm.weights == [] and norm.groups == 27
    assert model.get_layer("conv1").output.shape[1:] == (4, 4, 16)
    assert model.get_layer("flatten").output.shape[1:] == (512,)
    # 81·9·16+16, 16·9·32+32, 512·32+32, 32·10+10
    assert model.count_params() == 11680 + 4640 + 16416 + 330
    # GroupNorm of channels-last x: each example's 3 consecutive channels, all positions.
    x = np.random.default_rng(0).normal(2.0, 3.0, (2, 7, 7, 81)).astype(np.float32)
    got = keras.Model(model.input, norm.output)(x).numpy()
    g = x.reshape(2, 7, 7, 27, 3)
    mean, var = g.mean(axis=(1, 2, 4), keepdims=True), g.var(axis=(1, 2, 4), keepdims=True)
    np.testing.assert_allclose(got, ((g - mean) / np.sqrt(var + 1e-5)).reshape(x.shape),
                               rtol=1e-4, atol=1e-4)


def test_dp_step_clips_each_example_through_group_norm():
    # One DP-SGD step with σ=0 on 2 examples, lr=1: Δw = -(clip(g1) + clip(g2)) / 2,
    # with g_i the per-example gradients from a tape (through GroupNorm).
    keras.utils.set_random_seed(0)
    model = scatternet.scatternet_cnn("tanh", input_shape=(4, 4, 9), groups=3)
    x = np.random.default_rng(1).normal(size=(2, 4, 4, 9)).astype(np.float32)
    y = np.array([1, 7])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    per_example = []
    for i in range(2):
        with tf.GradientTape() as tape:
            li = loss(y[i:i + 1], model(x[i:i + 1]))[0]
        per_example.append(tape.gradient(li, model.trainable_variables))
    clip = 0.05
    expected = []
    for v_idx, v in enumerate(model.trainable_variables):
        total = 0
        for g in per_example:
            norm = np.sqrt(sum(float(tf.reduce_sum(t ** 2)) for t in g))
            total = total + g[v_idx].numpy() * min(1.0, clip / norm)
        expected.append(v.numpy() - total / 2)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss)
    model.train_on_batch(x, y)
    for v, e in zip(model.trainable_variables, expected):
        np.testing.assert_allclose(v.numpy(), e, rtol=1e-4, atol=1e-6)


def test_train_config_builds_the_scatternet_cnn():
    config = common.validate_config(common.TrainConfig(features="scatternet", norm_groups=9,
                                                       activation="relu", momentum=0.9))

    class _Data:  # what build_model reads of a Dataset
        input_shape, num_classes = (7, 7, 81), 10

    model = model_builders.build_model(config, _Data())
    assert model.name == "scatternet_cnn" and model.get_layer("group_norm").groups == 9
    with pytest.raises(common.ConfigError, match="--features='edges' is invalid"):
        common.validate_config(common.TrainConfig(features="edges"))
    with pytest.raises(common.ConfigError, match="--momentum only applies to --optimizer=sgd, not --optimizer=adam"):
        common.validate_config(common.TrainConfig(optimizer="adam", momentum=0.9))
    with pytest.raises(common.ConfigError, match="--momentum=1.0 is invalid"):
        common.validate_config(common.TrainConfig(momentum=1.0))


def test_train_config_builds_the_linear_head():
    class _Data:  # what build_model reads of a Dataset
        input_shape, num_classes = (7, 7, 81), 10

    config = common.validate_config(common.TrainConfig(features="scatternet", head="linear"))
    model = model_builders.build_model(config, _Data())
    assert model.name == "scatternet_linear"
    # GroupNorm (no weights) then one Dense: 3969·10 + 10 parameters.
    assert [w.shape for w in model.trainable_weights] == [(7 * 7 * 81, 10), (10,)]
    x = np.random.default_rng(0).normal(size=(2, 7, 7, 81)).astype("float32")
    normalized = model.get_layer("group_norm")(x).numpy().reshape(2, -1)
    kernel, bias = (w.numpy() for w in model.get_layer("logits").weights)
    np.testing.assert_allclose(model(x).numpy(), normalized @ kernel + bias, rtol=1e-5,
                               atol=1e-5)


def test_shifted_features_are_the_features_of_the_shifted_images():
    """Variant a·(2s+1)+b: the images zero-padded by s and cropped at (a, b), the shifts
    tf_tempered.augment.random_shift_flip draws."""
    from tf_tempered import augment  # pylint: disable=g-import-not-at-top
    images = np.random.default_rng(0).random((3, 8, 8)).astype("float32")
    variants = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                      cache=False)
    assert variants.shape == (3, 9, 4, 4, 3) and variants.dtype == np.float16
    padded = np.pad(images, [(0, 0), (1, 1), (1, 1)])
    for a in range(3):
        for b in range(3):
            expected = scatternet.scattering_features(padded[:, a:a + 8, b:b + 8], J=1, L=2,
                                                      cache=False)
            np.testing.assert_allclose(variants[:, a * 3 + b], expected, rtol=1e-3, atol=1e-3)
    # The unshifted variant (a = b = s) is the plain features.
    np.testing.assert_allclose(variants[:, 4], scatternet.scattering_features(
        images, J=1, L=2, cache=False), rtol=1e-3, atol=1e-3)
    # random_shift_flip's crops at every offset are exactly these shifted images.
    shifted = augment.random_shift_flip(images[..., None], max_shift=1, flip=False,
                                        seed=[5, 6]).numpy()[..., 0]
    crops = [padded[:, a:a + 8, b:b + 8] for a in range(3) for b in range(3)]
    for i in range(3):
        assert any(np.array_equal(shifted[i], crop[i]) for crop in crops)
    with pytest.raises(ValueError, match="max_shift=-1 is invalid"):
        scatternet.shifted_scattering_features(images, max_shift=-1, cache=False)


def test_flip_adds_the_features_of_every_shifted_image_mirrored():
    """flip=True: variant V + v (V = (2s+1)²) is variant v's shifted image mirrored left-right
    (shift, then mirror: random_shift_flip's order), so a uniform variant is its augmentation."""
    from tf_tempered import augment  # pylint: disable=g-import-not-at-top
    images = np.random.default_rng(1).random((3, 8, 8)).astype("float32")
    variants = scatternet.shifted_scattering_features(images, max_shift=1, flip=True, J=1, L=2,
                                                      cache=False)
    assert variants.shape == (3, 18, 4, 4, 3)
    padded = np.pad(images, [(0, 0), (1, 1), (1, 1)])
    crops = [padded[:, a:a + 8, b:b + 8] for a in range(3) for b in range(3)]
    for v, crop in enumerate(crops):
        for mirrored, image in ((0, crop), (1, crop[:, :, ::-1])):
            expected = scatternet.scattering_features(np.ascontiguousarray(image), J=1, L=2,
                                                      cache=False)
            np.testing.assert_allclose(variants[:, 9 * mirrored + v], expected, rtol=1e-3,
                                       atol=1e-3)
    # The features of a mirrored image are not a rearrangement of the plain ones' values
    # (why they are computed): e.g. variant 13 (unshifted, mirrored) differs from variant 4.
    assert np.abs(variants[:, 13].astype("float32") - variants[:, 4]).max() > 1e-2
    # Every image random_shift_flip makes is one of these 18.
    augmented = augment.random_shift_flip(images[..., None], max_shift=1, flip=True,
                                          seed=[3, 4]).numpy()[..., 0]
    images_of = crops + [crop[:, :, ::-1] for crop in crops]
    for i in range(3):
        assert any(np.array_equal(augmented[i], image[i]) for image in images_of)
    only_mirror = scatternet.shifted_scattering_features(images, max_shift=0, flip=True, J=1,
                                                         L=2, cache=False)
    np.testing.assert_array_equal(only_mirror, variants[:, [4, 13]])
    with pytest.raises(ValueError, match="flip='yes' is invalid"):
        scatternet.shifted_scattering_features(images, max_shift=0, flip="yes", cache=False)


def test_cached_mirrored_features(tmp_path):
    """One float16 file per variant but the plain one, the mirrored ones named _mirror_shift."""
    images = _images(4, 8, seed=2)
    in_memory = scatternet.shifted_scattering_features(images, max_shift=0, flip=True, J=1,
                                                       L=2, cache=False)
    cached = scatternet.shifted_scattering_features(images, max_shift=0, flip=True, J=1, L=2,
                                                    cache_dir=tmp_path)
    assert cached.shape == (4, 2, 4, 4, 3) and cached.shifts == ((0, 0, False), (0, 0, True))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and sum(f.endswith("_mirror_shift+0+0_float16.npy") for f in files) == 1
    np.testing.assert_array_equal(np.asarray(cached), in_memory)
    # The shifts-only files of the same images are shared (not recomputed) with flip=True.
    scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2, cache_dir=tmp_path)
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    both = scatternet.shifted_scattering_features(images, max_shift=1, flip=True, J=1, L=2,
                                                  cache_dir=tmp_path)
    assert len(list(tmp_path.iterdir())) == 18
    assert all(p.stat().st_mtime_ns == stamps[p.name] for p in tmp_path.iterdir()
               if p.name in stamps)
    np.testing.assert_array_equal(np.asarray(both)[:, [4, 13]], in_memory)


def test_missing_kymatio_names_the_pip_command(monkeypatch):
    import sys  # pylint: disable=g-import-not-at-top
    monkeypatch.setitem(sys.modules, "kymatio", None)  # what Python does when it is absent
    with pytest.raises(ImportError, match='pip install "kymatio>=0.3"'):
        scatternet.scattering_features(_images(1, 16), cache=False)
    # The model builder does not need kymatio.
    assert scatternet.scatternet_cnn("tanh", input_shape=(4, 4, 9), groups=3).count_params()


def test_cached_shifted_features_stay_on_disk_and_read_what_a_batch_needs(tmp_path):
    """One float16 file per shift (the unshifted one is the float32 features' file);
    reading them gives the in-memory array, and copies() picks as pick_variants does."""
    from tf_tempered import augment  # pylint: disable=g-import-not-at-top
    images = _images(5, 8)
    in_memory = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                       cache=False)
    cached = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                    cache_dir=tmp_path)
    assert isinstance(cached, scatternet.ShiftedFeatures)
    assert cached.shape == in_memory.shape == (5, 9, 4, 4, 3) and cached.dtype == np.float16
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 9 and sum(f.endswith("_float16.npy") for f in files) == 8
    assert any("_shift-1+1_float16" in f for f in files)  # (dy, dx) = (−1, +1): variant 6
    np.testing.assert_array_equal(np.asarray(cached), in_memory)
    np.testing.assert_array_equal(cached[:, 4], scatternet.scattering_features(
        images, J=1, L=2, cache=False).astype(np.float16))
    np.testing.assert_array_equal(cached[3], in_memory[3])
    # Dropping a block reads nothing; its rows are the other examples, in order.
    rest = cached.without_rows(1, 3)
    assert rest.rows.tolist() == [0, 3, 4] and rest.shape == (3, 9, 4, 4, 3)
    np.testing.assert_array_equal(np.asarray(rest), in_memory[[0, 3, 4]])
    rows = tf.constant([4, 0, 0, 3], tf.int64)
    copies = cached.copies(rows, 3, seed=[7, 8])
    assert copies.shape == (12, 4, 4, 3) and copies.dtype == tf.float32
    expected = augment.pick_variants(tf.constant(in_memory[[4, 0, 0, 3]]), 3, seed=[7, 8])
    np.testing.assert_array_equal(copies.numpy(), expected.numpy())
    padded = cached.copies(tf.constant([4, -1], tf.int64), 3, seed=[7, 8]).numpy()
    np.testing.assert_array_equal(padded[:3], expected.numpy()[:3])
    assert not padded[3:].any()  # a negative row (padding): zeros
    # A second call finds every file: nothing is recomputed (the files are not rewritten).
    stamps = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    again = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                   cache_dir=tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == stamps
    np.testing.assert_array_equal(np.asarray(again), in_memory)


def test_shifted_features_in_training_batches_and_validation_blocks(tmp_path):
    from tf_tempered import data  # pylint: disable=g-import-not-at-top
    from tf_tempered.experiments import (  # pylint: disable=g-import-not-at-top
        privacy_plan, train, train_data)
    images = _images(40, 8)
    cached = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                    cache_dir=tmp_path)
    x = data.without_block(cached, 10, 20)
    assert isinstance(x, scatternet.ShiftedFeatures) and len(x) == 30
    y = np.arange(40)[np.r_[0:10, 20:40]]
    config = common.validate_config(common.TrainConfig(
        dataset="digits", features="scatternet", batch_size=8, epochs=1, augmult=2,
        augment_shift=1, seed=0, insecure_dp_seed=3))
    plan = privacy_plan.plan_privacy(config, 30)
    batch_x, batch_y, info = next(iter(train_data.training_batches(config, plan, x, y)))
    assert batch_x.shape[1:] == (4, 4, 3) and batch_x.dtype == tf.float32
    assert batch_x.shape[0] == info["mask"].shape[0] == len(batch_y) and len(batch_y) % 2 == 0
    assert info["mask"].numpy().sum() > 0
    variants = np.asarray(cached).astype(np.float32)  # [40, 9, ...]
    for features, label, keep in zip(batch_x.numpy(), batch_y.numpy(), info["mask"].numpy()):
        if not keep:
            assert not features.any()  # padding: zeros, as poisson_batches pads
        else:  # each copy: one of the 9 shifts of its own example's features
            assert any(np.array_equal(features, v) for v in variants[label])


def test_cache_directory_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("TF_TEMPERED_CACHE", raising=False)
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path / "new"))
    assert scatternet.default_cache_dir() == tmp_path / "new" / "scatternet"
    monkeypatch.setenv("TF_TEMPERED_CACHE", str(tmp_path / "old"))  # the new name wins
    assert scatternet.default_cache_dir() == tmp_path / "new" / "scatternet"
    monkeypatch.delenv("TF_TEMPERED_CACHE_DIR")
    with pytest.warns(FutureWarning, match="TF_TEMPERED_CACHE_DIR"):
        assert scatternet.default_cache_dir() == tmp_path / "old" / "scatternet"
    monkeypatch.delenv("TF_TEMPERED_CACHE")
    assert scatternet.default_cache_dir().parts[-3:] == (".cache", "tf_tempered", "scatternet")


def test_progress_lines(tmp_path, capsys):
    scatternet.scattering_features(_images(3, 8), J=1, L=2, cache_dir=tmp_path)
    assert capsys.readouterr().out == ""  # small arrays: silent by default
    scatternet.scattering_features(_images(3, 8, seed=1), J=1, L=2, cache_dir=tmp_path,
                                   progress=True)
    out = capsys.readouterr().out.splitlines()
    assert "not cached yet, writing" in out[0] and out[-1].endswith("about 0 s left")
    assert "3/3 (100%)" in out[-1]
    scatternet.shifted_scattering_features(_images(3, 8, seed=1), max_shift=1, J=1, L=2,
                                           cache_dir=tmp_path, progress=True)
    out = capsys.readouterr().out
    assert "8 copies (shifts within ±1 px) of 3 images: computing 24 transforms" in out \
        and "24/24" in out


def test_large_training_arrays_are_read_per_batch(monkeypatch):
    """Poisson batches of an array from train_data.READ_PER_BATCH_BYTES on: its rows are read
    per batch (no TensorFlow copy of the array), padding zeros, as poisson_batches gives."""
    from tf_tempered.experiments import (  # pylint: disable=g-import-not-at-top
        privacy_plan, train, train_data)
    x = np.random.default_rng(0).random((50, 2, 2, 3), dtype=np.float32)
    y = np.arange(50)
    config = common.validate_config(common.TrainConfig(dataset="digits", batch_size=10,
                                                       epochs=1, insecure_dp_seed=4))
    plan = privacy_plan.plan_privacy(config, 50)
    monkeypatch.setattr(train_data, "READ_PER_BATCH_BYTES", 1)
    batch_x, batch_y, info = next(iter(train_data.training_batches(config, plan, x, y)))
    monkeypatch.setattr(train_data, "READ_PER_BATCH_BYTES", 1 << 60)
    ref_x, ref_y, ref_info = next(iter(train_data.training_batches(config, plan, x, y)))
    np.testing.assert_array_equal(batch_y.numpy(), ref_y.numpy())
    np.testing.assert_array_equal(info["mask"].numpy(), ref_info["mask"].numpy())
    np.testing.assert_array_equal(batch_x.numpy(), ref_x.numpy())
    keep = info["mask"].numpy() > 0
    np.testing.assert_array_equal(batch_x.numpy()[keep], x[batch_y.numpy()[keep]])
    assert not batch_x.numpy()[~keep].any() and (~keep).any()


def test_row_files_read_any_rows_as_the_array_holds_them(tmp_path, monkeypatch):
    from tf_tempered.scatternet import cache  # pylint: disable=g-import-not-at-top
    x = np.random.default_rng(0).random((3000, 2, 3), dtype=np.float32).astype(np.float16)
    np.save(tmp_path / "x.npy", x)
    rows = cache.RowFile(tmp_path / "x.npy")
    assert rows.shape == x.shape and rows.dtype == np.float16
    picks = [[5, 1, 5, 2999, 0, 1, 2], [], np.arange(3000), np.arange(2999, -1, -1),
             np.random.default_rng(1).integers(0, 3000, 700)]
    for pick in picks:  # any order, repeats, runs longer than one read's buffers
        np.testing.assert_array_equal(rows.take(pick), x[np.asarray(pick, np.int64)])
    calls = []
    real = cache._read_at
    monkeypatch.setattr(cache, "_read_at", lambda fd, buffers, *rest: calls.append(
        len(buffers)) or real(fd, buffers, *rest))
    rows.take([7, 8, 9, 3, 20, 21])
    assert sorted(calls) == [1, 2, 3]  # one read per run of consecutive rows
    with pytest.raises(IndexError, match=r"rows out of \[0, 3000\)"):
        rows.take([3000])
    with pytest.raises(IndexError, match="rows out of"):
        rows.take([-1])
    with open(tmp_path / "x.npy", "r+b") as f:  # truncated after the header was read
        f.truncate(1000)
    with pytest.raises(OSError, match="truncated: delete it"):
        rows.take([2999])


@pytest.mark.parametrize("missing", [("preadv",), ("preadv", "pread")])
def test_row_files_without_preadv(tmp_path, monkeypatch, missing):
    from tf_tempered.scatternet import cache  # pylint: disable=g-import-not-at-top
    x = np.arange(60, dtype=np.float32).reshape(20, 3)
    np.save(tmp_path / "x.npy", x)
    rows = cache.RowFile(tmp_path / "x.npy")
    for name in missing:  # macOS has no os.preadv; Windows neither os.pread
        monkeypatch.delattr(cache.os, name, raising=False)
    np.testing.assert_array_equal(rows.take([4, 3, 5, 19, 4]), x[[4, 3, 5, 19, 4]])


def test_feature_power_compresses_each_value_and_round_trips(tmp_path):
    layer = scatternet.FeaturePower(0.25, name="p")
    x = np.array([[16.0, -81.0, 0.0, 1e-4]], np.float32)
    np.testing.assert_allclose(layer(x).numpy(), [[2.0, -3.0, 0.0, 0.1]], rtol=1e-6)
    clone = scatternet.FeaturePower.from_config(layer.get_config())
    assert clone.power == 0.25 and clone.name == "p"
    model = scatternet.scatternet_linear(input_shape=(2, 2, 3), groups=3, power=0.5)
    path = str(tmp_path / ("model.keras" if keras.__version__[0] == "3" else "model.h5"))
    model.save(path)
    loaded = keras.models.load_model(path)
    assert loaded.get_layer("feature_power").power == 0.5
    features = np.random.default_rng(0).random((4, 2, 2, 3)).astype("float32")
    np.testing.assert_allclose(loaded(features).numpy(), model(features).numpy(), rtol=1e-6)
    for bad in (0, -1.0, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="power=.* is invalid: it must be a finite number > 0"):
            scatternet.FeaturePower(bad)


def test_train_config_compresses_the_features_before_the_group_norm():
    class _Data:  # what build_model reads of a Dataset
        input_shape, num_classes = (7, 7, 81), 10

    config = common.validate_config(common.TrainConfig(features="scatternet", head="linear",
                                                       feature_power=0.5))
    model = model_builders.build_model(config, _Data())
    assert [layer.name for layer in model.layers[1:3]] == ["feature_power", "group_norm"]
    x = np.random.default_rng(0).random((2, 7, 7, 81)).astype("float32")
    normalized = model.get_layer("group_norm")(np.sqrt(x)).numpy().reshape(2, -1)
    kernel, bias = (w.numpy() for w in model.get_layer("logits").weights)
    np.testing.assert_allclose(model(x).numpy(), normalized @ kernel + bias, rtol=1e-4,
                               atol=1e-4)
    cnn = model_builders.build_model(common.validate_config(common.TrainConfig(
        features="scatternet", feature_power=0.25)), _Data())
    assert cnn.get_layer("feature_power").power == 0.25
    # The default adds no layer: the models trained before the flag are unchanged.
    plain = model_builders.build_model(common.validate_config(common.TrainConfig(
        features="scatternet", head="linear")), _Data())
    assert "feature_power" not in [layer.name for layer in plain.layers]
    for flags, message in (
            ({"feature_power": 0.5}, "--feature_power=0.5 applies to --features=scatternet only"),
            ({"features": "scatternet", "feature_power": 0.0}, "--feature_power=0.0 is invalid"),
            ({"features": "scatternet", "feature_power": 0.5, "feature_norm": "dp_stats"},
             "the statistics are released on the features before the power. Fix: drop")):
        with pytest.raises(common.ConfigError, match=message):
            common.validate_config(common.TrainConfig(**flags))


def test_private_training_sees_through_the_feature_power():
    """A model with FeaturePower first trains privately: its Dense layer's per-example
    gradients are of the compressed features (the update equals the reference's)."""
    model = scatternet.scatternet_linear(input_shape=(2, 2, 3), groups=3, power=0.5,
                                         num_classes=3)
    private = make_private(model, l2_norm_clip=1e9, noise_multiplier=0.0, sampling="shuffle")
    features = np.random.default_rng(1).random((8, 2, 2, 3)).astype("float32")
    labels = np.arange(8) % 3
    kernel_before = model.get_layer("logits").kernel.numpy().copy()
    with tf.GradientTape() as tape:
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
            labels, model(features))
    expected = tape.gradient(loss, model.get_layer("logits").kernel).numpy()
    private.compile(optimizer=keras.optimizers.SGD(1.0),
                    loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    private.fit(features, labels, batch_size=8, epochs=1, shuffle=False, verbose=0)
    np.testing.assert_allclose(kernel_before - model.get_layer("logits").kernel.numpy(),
                               expected, rtol=1e-4, atol=1e-6)


@pytest.mark.keras3_suite  # numpy and TF only: the same on either Keras
def test_log8_storage_holds_every_variant_in_one_byte_a_feature(tmp_path):
    """storage="log8": nine files of codes (the unshifted one too, no float32 file), read
    as float32 within 2.2% of the float features; copies() and one variant's rows read
    what the in-memory array holds."""
    from tf_tempered import augment  # pylint: disable=g-import-not-at-top
    images = _images(5, 8)
    exact = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                   cache=False, storage="float16")
    in_memory = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                       cache=False, storage="log8")
    cached = scatternet.shifted_scattering_features(images, max_shift=1, J=1, L=2,
                                                    cache_dir=tmp_path, storage="log8")
    assert cached.dtype == in_memory.dtype == np.float32 and cached.storage == "log8"
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 9 and all(f.endswith("_log8.npy") for f in files)
    assert any("_shift+0+0_log8" in f for f in files)
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) < 9 * (5 * 48 + 128 + 1)
    np.testing.assert_array_equal(np.asarray(cached), in_memory)
    float_values = exact.astype(np.float32)
    big = float_values > 1e-4
    assert np.abs(in_memory[big] / float_values[big] - 1).max() < 0.0221
    plain = cached.variant((0, 0, False))
    assert isinstance(plain, scatternet.VariantRows) and plain.shape == (5, 4, 4, 3)
    np.testing.assert_array_equal(plain[1:4], in_memory[1:4, 4])
    np.testing.assert_array_equal(plain[2], in_memory[2, 4])
    np.testing.assert_array_equal(np.asarray(plain.without_rows(0, 2)), in_memory[2:, 4])
    copies = cached.copies(tf.constant([4, 0, -1], tf.int64), 3, seed=[7, 8]).numpy()
    expected = augment.pick_variants(tf.constant(in_memory[[4, 0, 0]]), 3, seed=[7, 8]).numpy()
    np.testing.assert_allclose(copies[:6], expected[:6], rtol=1e-6, atol=0)
    assert not copies[6:].any()  # padding
    with pytest.raises(ValueError, match="storage='int4' is invalid"):
        scatternet.shifted_scattering_features(images, max_shift=1, storage="int4")
