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
"""DP per-channel feature statistics, their accounting, and --feature_norm in the train script."""

import warnings

import dp_accounting
import numpy as np
import pytest

from tf_tempered import feature_stats, scatternet
from tf_tempered.callbacks import PrivacyBudget
from tf_tempered.experiments import common, feature_norm, model_builders
from tf_tempered.privacy import accounting

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # insecure_dp_seed's warning

DPSGD = dict(num_examples=60000, batch_size=1024, steps=1475, delta=1e-5)


def test_tiny_noise_gives_the_exact_mean_and_variance():
    x = np.random.default_rng(0).random((50, 3, 3, 4))
    stats = feature_stats.dp_channel_stats(x, noise_multiplier=1e-12, mean_clip=100.0,
                                           square_clip=100.0, insecure_dp_seed=1)
    flat = x.reshape(-1, 4)
    np.testing.assert_allclose(stats.mean, flat.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.variance, flat.var(0), rtol=1e-5)


def test_each_example_is_clipped_to_its_norm_before_summing():
    # Example means (3, 4) and (0.3, 0.4): the first is scaled to norm 1, the second kept.
    x = np.array([[[[3.0, 4.0]]], [[[0.3, 0.4]]]])
    stats = feature_stats.dp_channel_stats(x, noise_multiplier=1e-12, mean_clip=1.0,
                                           square_clip=1e6, insecure_dp_seed=0)
    np.testing.assert_allclose(stats.mean, [(0.6 + 0.3) / 2, (0.8 + 0.4) / 2], rtol=1e-6)
    squares = np.array([[9.0, 16.0], [0.09, 0.16]])
    np.testing.assert_allclose(stats.variance, squares.mean(0) - stats.mean ** 2, rtol=1e-5)


def test_noise_std_is_sigma_times_clip_over_n():
    n, channels, sigma, clip = 10, 40000, 2.0, 0.5
    stats = feature_stats.dp_channel_stats(np.zeros((n, 1, 1, channels)), noise_multiplier=sigma,
                                           mean_clip=clip, square_clip=clip, insecure_dp_seed=3)
    assert np.std(stats.mean) == pytest.approx(sigma * clip / n, rel=0.02)
    assert abs(np.mean(stats.mean)) < 4 * sigma * clip / n / np.sqrt(channels)
    # Seeded draws repeat; secret ones (the default) do not.
    again = feature_stats.dp_channel_stats(np.zeros((n, 1, 1, 8)), noise_multiplier=sigma,
                                           insecure_dp_seed=3).mean
    assert np.array_equal(again, feature_stats.dp_channel_stats(
        np.zeros((n, 1, 1, 8)), noise_multiplier=sigma, insecure_dp_seed=3).mean)
    secret = [feature_stats.dp_channel_stats(np.zeros((n, 1, 1, 8)), noise_multiplier=sigma).mean
              for _ in range(2)]
    assert not np.array_equal(*secret)


@pytest.mark.parametrize("kwargs, name", [
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=8.0, mean_clip=-1.0), "mean_clip"),
    (dict(noise_multiplier=8.0, square_clip=float("inf")), "square_clip"),
])
def test_bad_arguments_name_themselves(kwargs, name):
    with pytest.raises(ValueError, match=name):
        feature_stats.dp_channel_stats(np.ones((2, 1, 1, 3)), **kwargs)


def test_epsilon_composes_the_release_with_dp_sgd():
    sigma = 1.25
    prior = (feature_stats.release_event(8.0),)
    with_stats = accounting.compute_epsilon(noise_multiplier=sigma, prior_events=prior, **DPSGD)
    without = accounting.compute_epsilon(noise_multiplier=sigma, **DPSGD)
    by_hand = dp_accounting.rdp.RdpAccountant()
    by_hand.compose(dp_accounting.GaussianDpEvent(8.0), 2)
    by_hand.compose(dp_accounting.PoissonSampledDpEvent(1024 / 60000,
                                                        dp_accounting.GaussianDpEvent(sigma)), 1475)
    assert with_stats == pytest.approx(by_hand.get_epsilon(1e-5), rel=1e-9)
    assert with_stats > without
    alone = accounting.prior_epsilon(prior, delta=1e-5)
    only = dp_accounting.rdp.RdpAccountant()
    only.compose(dp_accounting.GaussianDpEvent(8.0), 2)
    assert alone == pytest.approx(only.get_epsilon(1e-5), rel=1e-9) and 0 < alone < with_stats


def test_calibration_leaves_room_for_the_release():
    prior = (feature_stats.release_event(8.0),)
    kwargs = dict(target_epsilon=2.93, num_examples=60000, batch_size=1024, steps=1475,
                  delta=1e-5)
    sigma = accounting.noise_multiplier_for_epsilon(prior_events=prior, **kwargs)
    plain = accounting.noise_multiplier_for_epsilon(**kwargs)
    assert sigma > plain
    eps = accounting.compute_epsilon(noise_multiplier=sigma, prior_events=prior, **DPSGD)
    assert 0.99 * 2.93 <= eps <= 2.93
    with pytest.raises(ValueError, match="already spent before training"):
        accounting.noise_multiplier_for_epsilon(
            prior_events=(feature_stats.release_event(0.5),), **kwargs)
    with pytest.raises(ValueError, match="prior_events must be a sequence"):
        accounting.compute_epsilon(noise_multiplier=1.0, prior_events=[1.0], **DPSGD)


def test_privacy_budget_reports_the_composition():
    prior = (feature_stats.release_event(8.0),)
    budget = PrivacyBudget(target_epsilon=3.0, delta=1e-5, num_examples=60000, batch_size=1024,
                           noise_multiplier=1.25, prior_events=prior, sampling="poisson")
    budget._resolve_legacy()  # what on_train_begin does for a model tf_tempered does not train
    expected = accounting.compute_epsilon(num_examples=60000, batch_size=1024,
                                          noise_multiplier=1.25, steps=590, delta=1e-5,
                                          prior_events=prior)
    assert budget.epsilon_after(10, steps_per_epoch=59) == pytest.approx(expected, rel=1e-12)


def test_config_refuses_what_cannot_apply():
    with pytest.raises(common.ConfigError, match="applies to --features=scatternet only"):
        common.validate_config(common.TrainConfig(feature_norm="dp_stats"))
    with pytest.raises(common.ConfigError, match="--nodpsgd trains without privacy"):
        common.validate_config(common.TrainConfig(features="scatternet", feature_norm="dp_stats",
                                                  dpsgd=False))
    with pytest.raises(common.ConfigError, match="--feature_norm='bn' is invalid"):
        common.validate_config(common.TrainConfig(features="scatternet", feature_norm="bn"))
    with pytest.raises(common.ConfigError, match="--feature_norm_noise=0 is invalid"):
        common.validate_config(common.TrainConfig(features="scatternet", feature_norm="dp_stats",
                                                  feature_norm_noise=0))
    with pytest.raises(common.ConfigError, match="measured on Fashion-MNIST itself"):
        common.validate_config(common.TrainConfig(features="scatternet", feature_norm="dp_stats",
                                                  dataset="fashion_mnist"))
    common.validate_config(common.TrainConfig(features="scatternet", feature_norm="dp_stats",
                                              dataset="fashion_mnist",
                                              feature_norm_mean_clip=0.25))
    config = common.validate_config(common.TrainConfig(features="scatternet",
                                                       feature_norm="dp_stats"))
    with pytest.raises(common.ConfigError, match="needs the released statistics"):
        model_builders.build_model(config, _Data())


class _Data:  # what build_model reads of a Dataset
    input_shape, num_classes = (2, 2, 3), 10


def test_model_normalizes_with_the_frozen_released_statistics():
    config = common.validate_config(common.TrainConfig(features="scatternet",
                                                       feature_norm="dp_stats"))
    x = np.random.default_rng(2).random((40, 2, 2, 3)).astype(np.float32)
    stats = feature_norm.release(config.replace(insecure_dp_seed=5), x)
    model = model_builders.build_model(config, _Data(), feature_stats=stats)
    layer = model.get_layer("feature_norm")
    assert not layer.trainable_weights
    import tf_tempered._compat as compat  # pylint: disable=g-import-not-at-top
    probe = compat.keras.Model(model.input, layer.output)
    expected = (x - stats.mean) / np.sqrt(stats.variance + feature_norm.VARIANCE_EPSILON)
    np.testing.assert_allclose(probe(x).numpy(), expected, rtol=1e-5, atol=1e-5)
    none = model_builders.build_model(common.TrainConfig(features="scatternet", feature_norm="none"),
                              _Data())
    assert [l.name for l in none.layers][1] == "conv1"
    with pytest.raises(ValueError, match="not both"):
        scatternet.scatternet_cnn(input_shape=(2, 2, 3), groups=3,
                                  normalization=(stats.mean, stats.variance + 1e-5))


# keras3_suite: the train script sits above make_private and fit, which the Keras 2 suite
# tests directly (as tests/test_train.py).
@pytest.mark.keras3_suite
def test_train_script_accounts_for_the_release():
    pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")
    from tf_tempered.experiments.train import run_training  # pylint: disable=g-import-not-at-top
    base = dict(dataset="digits", features="scatternet", activation="tanh", epochs=2,
                batch_size=64, target_epsilon=3.0, learning_rate=1.0, l2_norm_clip=0.1,
                num_train=600, num_test=100)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dp = run_training(common.validate_config(common.TrainConfig(feature_norm="dp_stats",
                                                                    **base)), verbose=0)
        group = run_training(common.validate_config(common.TrainConfig(**base)), verbose=0)
    prior = (feature_stats.release_event(8.0),)
    assert dp["epsilon_feature_stats"] == pytest.approx(
        accounting.prior_epsilon(prior, delta=1e-5))
    assert group["epsilon_feature_stats"] is None
    assert dp["noise_multiplier"] > group["noise_multiplier"]
    for record in dp["history"]:
        assert record["epsilon"] == pytest.approx(accounting.compute_epsilon(
            num_examples=600, batch_size=64, noise_multiplier=dp["noise_multiplier"],
            steps=record["steps"], delta=1e-5, prior_events=prior), rel=1e-9)
    assert 0.99 * 3.0 <= dp["epsilon"] <= 3.0
    assert "composed with the DP feature statistics" in dp["epsilon_label"]


def test_release_is_stored_once_and_reused_on_resume(tmp_path):
    config = common.validate_config(common.TrainConfig(features="scatternet",
                                                       feature_norm="dp_stats"))
    x = np.random.default_rng(3).random((50, 2, 2, 3))
    store = tmp_path / "backup" / feature_norm.STORE_NAME
    first = feature_norm.release(config.replace(insecure_dp_seed=1), x, store=store)
    assert store.exists()
    # Another seed draws other noise, unless the stored release is reused.
    other = feature_norm.release(config.replace(insecure_dp_seed=2), x)
    assert not np.allclose(other.mean, first.mean)
    again = feature_norm.release(config.replace(insecure_dp_seed=2), x, store=store)
    np.testing.assert_array_equal(again.mean, first.mean)
    np.testing.assert_array_equal(again.variance, first.variance)
    assert again.event == feature_stats.release_event(8.0)
    with pytest.raises(ValueError, match="Fix: resume with the same flags"):
        feature_norm.release(config.replace(feature_norm_noise=4.0), x, store=store)
    with pytest.raises(ValueError, match="'num_examples': 50"):
        feature_norm.release(config, x[:40], store=store)


# keras3_suite: the train script sits above make_private and fit, which the Keras 2 suite
# tests directly (as tests/test_train.py).
@pytest.mark.keras3_suite
def test_train_script_reuses_the_release_in_backup_dir(tmp_path):
    pytest.importorskip("kymatio.scattering2d.frontend.numpy_frontend")
    from tf_tempered.experiments.train import run_training  # pylint: disable=g-import-not-at-top
    config = common.validate_config(common.TrainConfig(
        dataset="digits", features="scatternet", feature_norm="dp_stats", epochs=1,
        batch_size=64, noise_multiplier=1.0, num_train=100, num_test=20))
    # A release stored by an earlier start with other flags: the script must read it.
    x = np.zeros((100, 2, 2, 3))
    feature_norm.release(config.replace(feature_norm_noise=4.0, insecure_dp_seed=0), x,
                         store=tmp_path / feature_norm.STORE_NAME)
    with pytest.raises(ValueError, match="released with"):
        run_training(config, verbose=0, backup_dir=tmp_path)


def test_an_example_with_a_non_finite_feature_adds_nothing_to_the_release():
    # Before: one inf pixel made its channel's released mean NaN (inf · 0 in the clipping),
    # revealing the example with certainty; a NaN made every channel NaN.
    features = np.random.default_rng(0).uniform(size=(200, 2, 2, 3))
    for bad in (np.inf, np.nan):
        poisoned = np.concatenate([features, np.full((1, 2, 2, 3), 0.5)], axis=0)
        poisoned[-1, 0, 0, 0] = bad
        stats = feature_stats.dp_channel_stats(poisoned, noise_multiplier=8.0, insecure_dp_seed=0)
        assert np.all(np.isfinite(stats.mean)) and np.all(np.isfinite(stats.variance))
