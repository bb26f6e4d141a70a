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
    for c in range(2):
        for k in (0, 1, 16, 17, 80):
            np.testing.assert_array_equal(got[..., c * 81 + k], ref[:, c, k])


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


def test_missing_kymatio_names_the_pip_command(monkeypatch):
    import sys  # pylint: disable=g-import-not-at-top
    monkeypatch.setitem(sys.modules, "kymatio", None)  # what Python does when it is absent
    with pytest.raises(ImportError, match='pip install "kymatio>=0.3"'):
        scatternet.scattering_features(_images(1, 16), cache=False)
    # The model builder does not need kymatio.
    assert scatternet.scatternet_cnn("tanh", input_shape=(4, 4, 9), groups=3).count_params()
