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
"""tf_tempered.budget_settings: what PrivacyBudget reads from a model (DP settings, ε holds)."""

import warnings

import pytest

from tf_tempered._compat import keras, tensorflow_privacy, tf
from tf_tempered.budget_settings import legacy_dp_settings
from tf_tempered.privacy import DPKerasSGDOptimizer, NotPrivateError, make_private
from tf_tempered.callbacks import PrivacyBudget
from tf_tempered.privacy import accounting

from budget_models import BATCH, DELTA, N
from budget_models import data as _data
from budget_models import expected as _expected
from budget_models import model as _model


def test_legacy_settings_from_the_arguments():
    assert legacy_dp_settings(None, num_examples=N, batch_size=BATCH, noise_multiplier=2,
                              microbatch_size=None) == (2.0, 1)
    assert legacy_dp_settings(None, num_examples=N, batch_size=BATCH, noise_multiplier=2.0,
                              microbatch_size=4) == (2.0, 4)
    with pytest.raises(ValueError, match="num_examples= and batch_size="):
        legacy_dp_settings(None, num_examples=N, batch_size=None, noise_multiplier=1.0,
                           microbatch_size=None)
    with pytest.raises(NotPrivateError, match="nothing on this model clips and noises"):
        legacy_dp_settings(_model(keras.optimizers.SGD()), num_examples=N, batch_size=BATCH,
                           noise_multiplier=None, microbatch_size=None)
    # Before: without the sizes, a plain model was first told to pass them (probe W, LOW 4).
    with pytest.raises(NotPrivateError, match="nothing on this model clips and noises"):
        legacy_dp_settings(_model(keras.optimizers.SGD()), num_examples=None, batch_size=None,
                           noise_multiplier=None, microbatch_size=None)
    with pytest.raises(ValueError, match="found no noise_multiplier"):
        legacy_dp_settings(None, num_examples=N, batch_size=BATCH, noise_multiplier=None,
                           microbatch_size=None)


@pytest.mark.tf_privacy
def test_settings_from_dp_model_and_unsupported_optimizers():
    from tensorflow_privacy import DPKerasSGDOptimizer, DPSequential  # pylint: disable=g-import-not-at-top,redefined-outer-name
    from tf_tempered.callbacks import dp_optimizer_settings  # pylint: disable=g-import-not-at-top

    model = DPSequential(l2_norm_clip=1.0, noise_multiplier=1.3, num_microbatches=4,
                         layers=[keras.Input((4,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    budget.set_model(model)
    budget.set_params({"steps": 4, "epochs": 1, "verbose": 0})
    budget.on_train_begin()
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        expected = accounting.compute_epsilon(num_examples=N, batch_size=BATCH,
                                              noise_multiplier=1.3, epochs=1, delta=DELTA,
                                              sampling="shuffle", microbatch_size=4)
        assert budget.epsilon_after(1, steps_per_epoch=4) == expected
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        dp_optimizer_settings(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                  gradient_accumulation_steps=2))
    optimizer = DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0)
    optimizer._dp_sum_query = object()  # pylint: disable=protected-access
    with pytest.raises(ValueError, match="reproduces the Gaussian sum query only"):
        dp_optimizer_settings(optimizer)


@pytest.mark.parametrize("insecure_dp_seed", [None, 4])
def test_budget_says_whether_epsilon_holds(insecure_dp_seed, monkeypatch):
    from tf_tempered.privacy import dp_seeds  # pylint: disable=g-import-not-at-top
    monkeypatch.setattr(dp_seeds, "_warned", True)  # only PrivacyBudget's warning below
    x, y = _data()
    model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                         insecure_dp_seed=insecure_dp_seed)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(
                      from_logits=True, reduction="none"))
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget], verbose=0)
    said = [str(w.message) for w in caught if "PrivacyBudget" in str(w.message)]
    assert history.history["epsilon"] == pytest.approx(_expected(2, 2.0), rel=1e-12)
    if insecure_dp_seed is None:
        assert budget.epsilon_holds is True and not said
    else:
        assert budget.epsilon_holds is False
        assert len(said) == 1 and "the ε does NOT hold" in said[0]


@pytest.mark.tf_privacy
def test_budget_warns_when_tf_privacy_noise_follows_a_global_seed():
    x, y = _data()
    model = _model(tensorflow_privacy.DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=2.0,
                                       learning_rate=0.1))
    budget = PrivacyBudget(target_epsilon=100.0, delta=DELTA, num_examples=N, batch_size=BATCH)
    keras.utils.set_random_seed(0)
    try:
        with pytest.warns(UserWarning, match="TF Privacy's own DP path.*global seed"):
            model.fit(x, y, batch_size=BATCH, epochs=1, callbacks=[budget], verbose=0)
    finally:
        tf.random.set_seed(None)
    assert budget.epsilon_holds is None


@pytest.mark.tf_privacy
@pytest.mark.filterwarnings("ignore:.*WITHOUT privacy amplification")
def test_tf_privacy_s_own_path_counts_every_step_and_refuses_what_contradicts_it():
    x, y = _data()

    def tf_privacy_model(sigma=1.3, **kwargs):
        return _model(tensorflow_privacy.DPKerasSGDOptimizer(
            l2_norm_clip=1.0, noise_multiplier=sigma, learning_rate=0.1, **kwargs))

    def budget(**kwargs):
        return PrivacyBudget(target_epsilon=1000.0, delta=DELTA, num_examples=N,
                             batch_size=BATCH, **kwargs)

    def shuffled(passes, sigma=1.3):
        return accounting.compute_epsilon(num_examples=N, batch_size=BATCH,
                                          noise_multiplier=sigma, epochs=passes, delta=DELTA,
                                          sampling="shuffle")

    # Before: each fit restarted at ε of one pass (ε 3.51, 5.21 for every fit of a loop).
    model = tf_privacy_model()
    for fit in range(3):
        history = model.fit(x, y, batch_size=BATCH, epochs=2, callbacks=[budget()], verbose=0)
        assert history.history["epsilon"] == pytest.approx(
            [shuffled(2 * fit + 1), shuffled(2 * fit + 2)], rel=1e-12)
    # Epochs of more steps than a pass: every pass begun counts (8 steps = 2 passes).
    history = tf_privacy_model().fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(
        BATCH).repeat(), steps_per_epoch=8, epochs=1, callbacks=[budget()], verbose=0)
    assert history.history["epsilon"] == pytest.approx([shuffled(2)], rel=1e-12)
    # Poisson ε for Keras' shuffled batches, or another σ or microbatch size than the
    # optimizer's, were taken as given before.
    for kwargs, message in (({"sampling": "poisson"}, "Keras' fit draws shuffled"),
                            ({"noise_multiplier": 1.5}, "adds noise_multiplier=1.3"),
                            ({"microbatch_size": 1}, "into 4 microbatches of 4")):
        with pytest.raises(ValueError, match=message):
            tf_privacy_model(num_microbatches=4).fit(x, y, batch_size=BATCH,
                                                     callbacks=[budget(**kwargs)], verbose=0)
