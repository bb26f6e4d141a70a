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
"""tf_tempered's own DP optimizers (TF Privacy's names and arguments, no TF Privacy)."""

import numpy as np
import pytest
from scipy import stats

import tf_tempered
from tf_tempered._compat import KERAS_MAJOR, keras, tensorflow_privacy, tf
from tf_tempered.privacy import (DPKerasAdagradOptimizer, DPKerasAdamOptimizer,
                                 DPKerasSGDOptimizer, dp_config, make_private)

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
CLASSES = {"sgd": DPKerasSGDOptimizer, "adam": DPKerasAdamOptimizer,
           "adagrad": DPKerasAdagradOptimizer}
# The active Keras' optimizers (Keras 2: the legacy ones, which TF Privacy's subclass).
_OPTIMIZERS = keras.optimizers if KERAS_MAJOR == 3 else keras.optimizers.legacy
BASES = {"sgd": _OPTIMIZERS.SGD, "adam": _OPTIMIZERS.Adam, "adagrad": _OPTIMIZERS.Adagrad}
BASE_KWARGS = {"sgd": {"learning_rate": 0.5, "momentum": 0.9},
               "adam": {"learning_rate": 0.05, "beta_1": 0.8},
               "adagrad": {"learning_rate": 0.3, "initial_accumulator_value": 0.2}}


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="tanh"),
                             keras.layers.Dense(3)])


def _data(n=16, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 6)).astype("float32") * 3, rng.integers(0, 3, n)


def _train(optimizer, private=True, steps=3, batch=8, seed=0):
    model = _model(seed)
    if private:
        make_private(model, sampling="shuffle")  # Keras' fixed batches, as TF Privacy's path
    model.compile(optimizer=optimizer, loss=LOSS)
    x, y = _data(batch * steps)
    model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
    return model


def test_exported_at_top_level_with_tf_privacy_bases():
    assert tf_tempered.DPKerasSGDOptimizer is DPKerasSGDOptimizer
    for key, cls in CLASSES.items():
        assert issubclass(cls, BASES[key])
        assert cls.__name__ == f"DPKeras{BASES[key].__name__}Optimizer"


@pytest.mark.parametrize("kwargs, name", [
    ({"l2_norm_clip": 0.0}, "l2_norm_clip"),
    ({"l2_norm_clip": -1.0}, "l2_norm_clip"),
    ({"l2_norm_clip": float("inf")}, "l2_norm_clip"),
    ({"l2_norm_clip": float("nan")}, "l2_norm_clip"),
    ({"l2_norm_clip": "1"}, "l2_norm_clip"),
    ({"noise_multiplier": -0.1}, "noise_multiplier"),
    ({"noise_multiplier": float("nan")}, "noise_multiplier"),
    ({"noise_multiplier": None}, "noise_multiplier"),
    ({"num_microbatches": 0}, "num_microbatches"),
    ({"num_microbatches": -4}, "num_microbatches"),
    ({"num_microbatches": 2.0}, "num_microbatches"),
    ({"num_microbatches": True}, "num_microbatches"),
    ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps"),
])
@pytest.mark.parametrize("key", sorted(CLASSES))
def test_bad_arguments_raise_naming_the_argument_and_fix(key, kwargs, name):
    args = {"l2_norm_clip": 1.0, "noise_multiplier": 1.1, **kwargs}
    with pytest.raises(ValueError, match=rf"^{name}.*Fix"):
        CLASSES[key](**args)


def test_tf_privacy_call_forms():
    # Keyword form (TF Privacy's tutorials) and positional privacy arguments.
    by_keyword = DPKerasSGDOptimizer(l2_norm_clip=1.5, noise_multiplier=0.7, num_microbatches=4,
                                     learning_rate=0.25)
    positional = DPKerasSGDOptimizer(1.5, 0.7, 4, learning_rate=0.25)
    for opt in (by_keyword, positional):
        assert (opt.l2_norm_clip, opt.noise_multiplier, opt.num_microbatches) == (1.5, 0.7, 4)
        assert float(opt.learning_rate) == 0.25
    assert DPKerasSGDOptimizer(1.0, 0.0, np.int64(2)).num_microbatches == 2
    with pytest.raises(TypeError):  # the base optimizer's arguments are keyword-only
        DPKerasSGDOptimizer(1.0, 1.0, None, 0.1)


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_config_round_trip_and_registered_name(key):
    opt = CLASSES[key](l2_norm_clip=0.7, noise_multiplier=1.3, num_microbatches=2,
                       **BASE_KWARGS[key])
    config = opt.get_config()
    assert {k: config[k] for k in ("l2_norm_clip", "noise_multiplier", "num_microbatches")} == {
        "l2_norm_clip": 0.7, "noise_multiplier": 1.3, "num_microbatches": 2}
    again = CLASSES[key].from_config(config)
    assert type(again) is CLASSES[key]
    assert again.get_config() == config
    serialized = keras.optimizers.serialize(opt)
    assert serialized["class_name"].endswith(CLASSES[key].__name__)
    restored = (keras.optimizers.deserialize(serialized) if KERAS_MAJOR == 3 else
                keras.optimizers.deserialize(serialized, use_legacy_optimizer=True))
    assert type(restored) is CLASSES[key] and restored.get_config() == config


def test_compiled_private_model_saves_and_reloads(tmp_path):
    model = _train(DPKerasAdamOptimizer(l2_norm_clip=1.0, noise_multiplier=0.5,
                                        learning_rate=0.01))
    path = tmp_path / ("model.keras" if KERAS_MAJOR == 3 else "model.h5")
    model.save(path)
    reloaded = keras.models.load_model(path)
    # Its own class, marked as a private model's (it refuses to train until make_private).
    assert isinstance(reloaded.optimizer, DPKerasAdamOptimizer)
    assert reloaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(reloaded.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_dp_config_reads_our_optimizers(key):
    config = dp_config(CLASSES[key](l2_norm_clip=2.5, noise_multiplier=1.1, num_microbatches=4))
    assert config.l2_norm_clip == 2.5
    assert config.noise_stddev == 2.5 * 1.1
    assert config.noise_multiplier == 1.1
    assert config.num_microbatches == 4
    assert dp_config(CLASSES[key](l2_norm_clip=1.0, noise_multiplier=0.0)).num_microbatches is None


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_fit_without_make_private_refuses_and_does_not_train(key):
    model = _model()
    model.compile(optimizer=CLASSES[key](l2_norm_clip=1.0, noise_multiplier=1.0,
                                         **BASE_KWARGS[key]), loss=LOSS)
    before = model.get_weights()
    x, y = _data()
    with pytest.raises(RuntimeError, match=r"call tf_tempered\.make_private\(model\) before "
                                           r"compile/fit"):
        model.fit(x, y, batch_size=8, verbose=0)
    for a, b in zip(model.get_weights(), before):
        np.testing.assert_array_equal(a, b)


def test_direct_apply_gradients_and_minimize_refuse():
    var = tf.Variable([1.0, 2.0])
    opt = DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=1.0)
    # The fix for a loop of one's own too (it named make_private only, which a loop's
    # already private model has had).
    with pytest.raises(RuntimeError, match=r"make_private.*in a loop of your own, take the "
                       r"gradients from tf_tempered\.privacy\.DPGradients.*plain Keras "
                       "optimizer"):
        opt.apply_gradients([(tf.constant([1.0, 1.0]), var)])
    if KERAS_MAJOR == 3:  # Keras 3 optimizers update through `apply` (no minimize)
        with pytest.raises(RuntimeError, match="make_private"):
            opt.apply([tf.constant([1.0, 1.0])], [var])
    else:
        with pytest.raises(RuntimeError, match="make_private"):
            opt.minimize(lambda: tf.reduce_sum(var ** 2), [var])
    np.testing.assert_array_equal(var.numpy(), [1.0, 2.0])


def test_engine_mark_is_used_up_by_one_step():
    model = _train(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0, learning_rate=0.1))
    assert int(model.optimizer.iterations) == 3
    assert model.optimizer._was_dp_gradients_called is False  # pylint: disable=protected-access
    # After private training, a custom loop cannot slip a non-private update through.
    grads = [tf.ones_like(v) for v in model.trainable_variables]
    with pytest.raises(RuntimeError, match="make_private"):
        model.optimizer.apply_gradients(zip(grads, model.trainable_variables))


def _hand_dp_sgd(model, x, y, lr):
    """One DP-SGD step, one example per microbatch, no noise, written out; clip = median norm."""
    per_example = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(LOSS(y[i:i + 1], model(x[i:i + 1])))
        per_example.append([g.numpy().astype(np.float64) for g in
                            tape.gradient(loss, model.trainable_variables)])
    norms = np.array([np.sqrt(sum(np.sum(g ** 2) for g in grads)) for grads in per_example])
    clip = float(np.median(norms))
    total = [sum(grads[j] * min(1.0, clip / n) for grads, n in zip(per_example, norms))
             for j in range(len(per_example[0]))]
    return clip, [w - lr * t / len(x) for w, t in zip(model.get_weights(), total)]


def test_update_equals_dp_sgd_written_out():
    x, y = _data(8)
    model = _model()
    clip, expected = _hand_dp_sgd(model, x, y, lr=0.3)
    make_private(model)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0,
                                                learning_rate=0.3), loss=LOSS)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    clipped = model.history.history["dp_clipped_fraction"][0]
    assert 0 < clipped < 1  # some examples clipped, some not: both branches checked
    for got, want in zip(model.get_weights(), expected):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_update_rule_is_the_base_optimizers(key):
    # Noise off, a clip no gradient reaches: the private update is the base
    # optimizer's update with the batch-mean gradient.
    x, y = _data(8)
    ours = _train(CLASSES[key](l2_norm_clip=1e6, noise_multiplier=0.0, **BASE_KWARGS[key]),
                  batch=8, steps=1)
    plain = _model()
    plain.compile(optimizer=BASES[key](**BASE_KWARGS[key]),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    plain.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    changed = False
    for a, b, w0 in zip(ours.get_weights(), plain.get_weights(), _model().get_weights()):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
        changed |= not np.allclose(a, w0)
    assert changed


def test_noise_std_is_noise_multiplier_times_clip():
    # Zero inputs and no bias: the gradient is zero, so the update is the noise:
    # -lr · N(0, (σC)²) / batch.
    clip, sigma, lr, batch = 0.5, 2.0, 1.0, 4
    model = make_private(keras.Sequential([keras.Input((100,)),
                                           keras.layers.Dense(60, use_bias=False)]))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=sigma,
                                                learning_rate=lr), loss=LOSS)
    before = model.get_weights()[0]
    model.fit(np.zeros((batch, 100), "float32"), np.zeros(batch), batch_size=batch, verbose=0)
    noise = (before - model.get_weights()[0]).ravel() * batch / lr
    std = sigma * clip
    assert stats.kstest(noise, stats.norm(0.0, std).cdf).pvalue > 1e-6  # false alarm 1e-6
    assert abs(noise.std() / std - 1) < 0.05  # 6000 draws: the std is within ~1%


@pytest.mark.tf_privacy
@pytest.mark.cover_each("key", "num_microbatches")  # each class, each microbatching once
@pytest.mark.parametrize("key", sorted(CLASSES))
@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_same_update_as_tf_privacy_optimizer(key, num_microbatches):
    """Ours + make_private == TF Privacy's + make_private == TF Privacy's own path."""
    tfp_cls = getattr(tensorflow_privacy, CLASSES[key].__name__)
    args = dict(l2_norm_clip=0.4, noise_multiplier=0.0, num_microbatches=num_microbatches,
                **BASE_KWARGS[key])
    ours = _train(CLASSES[key](**args)).get_weights()
    theirs_fast = _train(tfp_cls(**args)).get_weights()
    theirs_own = _train(tfp_cls(**args), private=False).get_weights()
    initial = _model().get_weights()
    assert any(not np.allclose(a, w0) for a, w0 in zip(ours, initial))
    for a, b, c in zip(ours, theirs_fast, theirs_own):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, c, rtol=0, atol=1e-5)


@pytest.mark.tf_privacy
def test_dp_config_agrees_with_tf_privacy():
    for key, cls in CLASSES.items():
        args = dict(l2_norm_clip=0.7, noise_multiplier=1.3, num_microbatches=4)
        ours = dp_config(cls(**args))
        theirs = dp_config(getattr(tensorflow_privacy, cls.__name__)(**args))
        assert (ours.l2_norm_clip, ours.noise_stddev, ours.num_microbatches) == (
            theirs.l2_norm_clip, theirs.noise_stddev, theirs.num_microbatches), key


def _noise_only_model(noise_multiplier):
    """A Dense fed zeros: its kernel's gradient is 0, so its update is the noise alone,
    lr·σC/B per coordinate."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((40,)), keras.layers.Dense(100)])
    make_private(model, sampling="shuffle")
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=noise_multiplier,
                                                learning_rate=1.0), loss=LOSS)
    return model


def _fit_and_measure_sigma(model, batch=8):
    x, y = np.zeros((batch, 40), np.float32), np.zeros(batch, np.int64)
    before = model.layers[0].kernel.numpy()
    epsilon = model.fit(x, y, batch_size=batch, verbose=0).history["epsilon"][-1]
    return (model.layers[0].kernel.numpy() - before).std() * batch / 1.0, epsilon


# Before: the step Keras had traced kept the old optimizer (σ = 0.5 measured) while the fit
# accounted the new one's σ = 4 (ε 10.8 logged for 16.5 spent), on both Kerases.
@pytest.mark.parametrize("replace", ["between_fits", "by_a_callback"])
def test_an_optimizer_assigned_without_compile_is_the_one_the_step_runs_and_accounts(replace):
    model, compiled = _noise_only_model(0.5), _noise_only_model(0.5)
    for m in (model, compiled):
        _fit_and_measure_sigma(m)
    new = DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=4.0, learning_rate=1.0)
    if replace == "between_fits":
        model.optimizer = new
    else:
        class Swap(keras.callbacks.Callback):
            def on_train_end(self, logs=None):
                self.model.optimizer = new
        model.fit(np.zeros((8, 40), np.float32), np.zeros(8, np.int64), batch_size=8,
                  verbose=0, callbacks=[Swap()])
        _fit_and_measure_sigma(compiled)  # the fit above, at σ = 0.5
    compiled.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=4.0,
                                                   learning_rate=1.0), loss=LOSS)
    sigma, epsilon = _fit_and_measure_sigma(model)
    _, epsilon_compiled = _fit_and_measure_sigma(compiled)
    assert abs(sigma - 4.0) < 0.25  # 4,000 noise coordinates: the new optimizer's σ
    assert epsilon == pytest.approx(epsilon_compiled)  # as after a compile
