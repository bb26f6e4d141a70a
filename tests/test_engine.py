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
"""The fast DP engine against TF Privacy's own DPKerasSGDOptimizer (the reference).

The engine runs with tf_tempered's DPKeras*Optimizer; the reference is TF Privacy's
optimizer of the same name and arguments on its own (slow) DP path. Where TF Privacy
is not installed (Python 3.12+), the comparisons skip (tests/test_conformance_*.py
and tests/test_optimizers.py compare with references written out).
"""

import warnings

import numpy as np
import pytest

import tf_tempered
import noise_statistics
from native_calls import record_calls
from dp_reference import _microbatch_grads
from tf_tempered._compat import KERAS_MAJOR, keras, tensorflow_privacy, tf
from tf_tempered.layers import TemperedSigmoid
from tf_tempered.privacy import errors
from tf_tempered.privacy import (DPConfig, DPKerasAdamOptimizer, DPKerasSGDOptimizer, EngineOptions,
                                 NotPrivateError, UnsupportedLayerError, dp_config,
                                 make_private)
from tf_tempered.privacy import native
from tf_tempered.privacy.step import chunk_sizes
from tf_tempered.privacy.optimizers import DPOptimizerMixin
from tf_tempered.privacy.state import get_state

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
BATCH = 16


def _cnn_learnable():
    return _cnn(learnable=True)


def _cnn(learnable=False):
    return keras.Sequential([
        keras.Input((12, 12, 2)),
        keras.layers.Conv2D(4, 3, strides=2, padding="same"),  # native op, or depthwise path
        TemperedSigmoid(scale=1.5, inverse_temperature=2.0, offset=0.5, learnable=learnable),
        keras.layers.MaxPool2D(2, strides=1),
        keras.layers.Conv2D(16, 3, padding="valid", activation="tanh"),  # native op, or patches
        keras.layers.AveragePooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dropout(0.0),
        keras.layers.Dense(8, activation=TemperedSigmoid(learnable=learnable)),
        keras.layers.Dense(3),
    ])


def _cnn_first_conv_frozen():
    model = _cnn()
    make_private(model)  # instrumented first, frozen after: the engine must notice
    model.layers[0].trainable = False
    return model


def _sequence_model():
    # Dense on a [B, T, d] input: several rows per example (ghost norm with R > 1).
    return keras.Sequential([keras.Input((5, 6)), keras.layers.Dense(7, activation="tanh"),
                             keras.layers.LayerNormalization(), keras.layers.Flatten(),
                             keras.layers.Dense(3)])


def _data(model, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(BATCH,) + tuple(model.input_shape[1:])).astype("float32")
    return x, rng.integers(0, 3, BATCH)


_INITIAL_WEIGHTS = {}


def _fresh(model_fn):
    """A new model with the same initial weights every time for this builder."""
    model = model_fn()
    key = (model_fn.__name__, tuple(w.shape for w in model.weights))
    model.set_weights(_INITIAL_WEIGHTS.setdefault(key, model.get_weights()))
    return model


def _non_private_copy(model):
    copy = keras.models.clone_model(model)
    copy.set_weights(model.get_weights())
    for layer, original in zip(copy.layers, model.layers):
        layer.trainable = original.trainable
    return copy


def _tf_privacy_reference(optimizer):
    """TF Privacy's optimizer with the name and config of our `optimizer` (others: as is).

    Returns None for a DP optimizer where TF Privacy is not available (Keras 3, or
    Python 3.12+): the callers then use the per-microbatch tape reference below.
    """
    if not isinstance(optimizer, DPOptimizerMixin):
        return optimizer
    if tensorflow_privacy is None:
        return None
    return getattr(tensorflow_privacy, type(optimizer).__name__)(**optimizer.get_config())


def _base_optimizer(dp_optimizer):
    """The plain Keras optimizer a DPKeras*Optimizer subclasses, with the same config."""
    config = {k: v for k, v in dp_optimizer.get_config().items()
              if k not in ("l2_norm_clip", "noise_multiplier", "num_microbatches")}
    base = next(c for c in type(dp_optimizer).__mro__[1:]
                if c.__module__.split(".")[0] in ("keras", "tf_keras"))
    return base.from_config(config)


def _tape_dp_gradient(model, x, y, config):
    """DP-SGD's gradient (noise 0) written out: one float64 tape per microbatch, clip, mean."""
    grads = _microbatch_grads(model, x, y, config.num_microbatches or len(x))
    norms = np.array([np.sqrt(sum(np.sum(t ** 2) for t in g)) for g in grads])
    factors = np.minimum(1.0, config.l2_norm_clip / norms)
    return [tf.constant(sum(f * g[i] for f, g in zip(factors, grads)) / len(grads), tf.float32)
            for i in range(len(grads[0]))]


def _tape_reference_fit(model, dp_optimizer, x, y, batch_size):
    """One epoch (no shuffling) of DP-SGD by the tape reference and the base optimizer."""
    config = dp_config(dp_optimizer)
    optimizer = _base_optimizer(dp_optimizer)
    for start in range(0, len(x), batch_size):
        grads = _tape_dp_gradient(model, x[start:start + batch_size], y[start:start + batch_size],
                                  config)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))


def _plain_sgd(**kwargs):
    """Keras' SGD (Keras 2: the legacy one, which TF Privacy's optimizers subclass)."""
    return (keras.optimizers.SGD if KERAS_MAJOR == 3 else keras.optimizers.legacy.SGD)(**kwargs)


def _update(model_fn, optimizer_fn, private, x, y, static_batch=False, options=None):
    """The update of one epoch in batches of BATCH: ours (private) or the reference's.

    The reference is TF Privacy's own optimizer where it is available (Keras 2,
    Python <= 3.11), else the per-microbatch tape reference.
    """
    model = _fresh(model_fn)
    if private:
        make_private(model, options=options)
    elif get_state(model) is not None:  # a builder that made it private: the reference
        model = _non_private_copy(model)  # trains a copy (its weights refuse other updates)
    optimizer = optimizer_fn() if private else _tf_privacy_reference(optimizer_fn())
    before = [w.copy() for w in model.get_weights()]
    if optimizer is None:
        _tape_reference_fit(model, optimizer_fn(), x, y, BATCH)
        return [a - b for a, b in zip(model.get_weights(), before)], model
    model.compile(optimizer=optimizer, loss=LOSS)
    # With drop_remainder the traced step knows the batch size; without it, it does
    # not. (fit on arrays of a whole number of batches would trace a static size.)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=static_batch)
    model.fit(data, epochs=1, verbose=0)
    return [a - b for a, b in zip(model.get_weights(), before)], model


def _assert_update_matches_tf_privacy(model_fn, optimizer_fn, x, y, static_batch=False,
                                      options=None):
    """make_private's update equals TF Privacy's own (noise off) to 1e-5 of its largest entry."""
    reference, _ = _update(model_fn, optimizer_fn, False, x, y)
    ours, _ = _update(model_fn, optimizer_fn, True, x, y, static_batch=static_batch,
                      options=options)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


@pytest.mark.cover_each()
@pytest.mark.parametrize("model_fn", [_cnn, _cnn_learnable, _cnn_first_conv_frozen,
                                      _sequence_model],
                         ids=["cnn", "cnn-learnable", "cnn-frozen", "sequence"])
@pytest.mark.parametrize("num_microbatches", [None, BATCH, 4, 1])
def test_update_equals_tf_privacy(model_fn, num_microbatches):
    x, y = _data(model_fn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                      num_microbatches=num_microbatches, learning_rate=1.0)
    _assert_update_matches_tf_privacy(model_fn, opt, x, y)


@pytest.mark.cover_each()
@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("forced", ["ghost", "materialize", "auto-no-memory"])
def test_every_norm_strategy_equals_tf_privacy(forced, static_batch):
    # TF ops only (the fallback without the native op). All Conv2D layers through
    # patches (no depthwise shortcut), every Dense/Conv2D layer through one strategy;
    # "auto-no-memory" lets the cost rule choose but leaves no memory to
    # materialize in (with a dynamic batch: decided per step).
    if forced == "auto-no-memory":
        options = EngineOptions(native=False, depthwise_max_channel_pairs=0,
                                materialize_max_bytes=0)
    else:
        options = EngineOptions(native=False, depthwise_max_channel_pairs=0, norm_path=forced)
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0)
    _assert_update_matches_tf_privacy(_cnn, opt, x, y, static_batch=static_batch,
                                      options=options)


@pytest.mark.cover_each()
@pytest.mark.parametrize("forced", ["ghost", "materialize", "auto"])
@pytest.mark.parametrize("num_microbatches,static_batch", [(None, True), (4, True), (None, False)],
                         ids=["static", "static-4-microbatches", "dynamic"])
def test_patches_in_chunks_equal_tf_privacy(forced, num_microbatches, static_batch):
    # A tiny chunk budget: every chunk is one microbatch (16 chunks, or 4 of 4
    # examples); with a dynamic batch "auto" decides per step (tf.cond), then chunks.
    options = EngineOptions(patch_chunk_bytes=1, native=False, depthwise_max_channel_pairs=0,
                            norm_path=forced)
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0,
                                      num_microbatches=num_microbatches)
    _assert_update_matches_tf_privacy(_cnn, opt, x, y, static_batch=static_batch,
                                      options=options)


@pytest.mark.cover_each()
@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
def test_depthwise_path_in_chunks_equals_tf_privacy(static_batch):
    # 16 examples in chunks of 5 (the last one short or zero-padded).
    options = EngineOptions(native=False, depthwise_chunk=5)
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0)
    _assert_update_matches_tf_privacy(_cnn, opt, x, y, static_batch=static_batch,
                                      options=options)


def _count_native_calls(monkeypatch):
    return record_calls(monkeypatch, "conv2d_group_kernel_grads",
                        lambda args, kwargs: kwargs["output_grads"])


@pytest.mark.cover_each()
@pytest.mark.parametrize("static_batch", [False, True], ids=["dynamic-batch", "static-batch"])
@pytest.mark.parametrize("num_microbatches", [None, 4])
@pytest.mark.parametrize("gradients", ["materialized", "norms-only", "separate", "default"])
def test_native_op_paths_equal_tf_privacy(monkeypatch, gradients, num_microbatches, static_batch):
    # Both Conv2D layers through the native op: with per-microbatch gradients
    # materialized (dynamic batch, one example per microbatch: decided per step),
    # with norms only (one of them fused: its norms, the clip factors and its clipped
    # sum in one op; "separate": neither, the book-keeping clipped sum), or as the rules
    # choose.
    if not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    options = {"materialized": EngineOptions(norm_path="native", native_materialize_min_rows=0),
               "norms-only": EngineOptions(norm_path="native", materialize_max_bytes=0),
               "separate": EngineOptions(norm_path="native", materialize_max_bytes=0,
                                         fused_clipped_sum=False),
               "default": EngineOptions(norm_path="native")}[gradients]
    calls = _count_native_calls(monkeypatch)
    fused = record_calls(monkeypatch, "conv2d_clipped_kernel_sum")
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0,
                                      num_microbatches=num_microbatches)
    _assert_update_matches_tf_privacy(_cnn, opt, x, y, static_batch=static_batch,
                                      options=options)
    if gradients in ("norms-only", "separate"):
        assert set(calls) == {False}
        assert bool(fused) == (gradients == "norms-only")
    elif gradients == "materialized":
        assert True in calls and not fused
    else:
        assert calls


def test_short_last_batch_with_microbatches_equals_tf_privacy():
    # 24 examples in batches of 16: the short last batch retraces the step with an
    # unknown batch size, and 4 microbatches hold several examples each (this
    # crashed on the Dense bias: "Incompatible shapes").
    rng = np.random.default_rng(5)
    x = rng.normal(size=(24, 5, 6)).astype("float32")
    y = rng.integers(0, 3, 24)
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, num_microbatches=4,
                                      learning_rate=1.0)

    def weights_after_epoch(private):
        model = _fresh(_sequence_model)
        if private:
            make_private(model, sampling="shuffle")  # the batches TF Privacy trains on
        optimizer = opt() if private else _tf_privacy_reference(opt())
        before = model.get_weights()
        if optimizer is None:
            _tape_reference_fit(model, opt(), x, y, BATCH)
        else:
            model.compile(optimizer=optimizer, loss=LOSS)
            model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        return [a - b for a, b in zip(model.get_weights(), before)]

    reference, ours = weights_after_epoch(False), weights_after_epoch(True)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


@pytest.mark.tf_privacy
def test_vectorized_optimizer_matches():
    x, y = _data(_cnn())
    opt = lambda: tensorflow_privacy.VectorizedDPKerasSGDOptimizer(
        l2_norm_clip=0.5, noise_multiplier=0.0, learning_rate=1.0)
    _assert_update_matches_tf_privacy(_cnn, opt, x, y)


def _gradients_given_to_optimizer(model_fn, optimizer_fn, private, x, y):
    """The gradients the optimizer's apply_gradients receives in one step, by variable."""
    model = _fresh(model_fn)
    if private:
        make_private(model)
    optimizer = optimizer_fn() if private else _tf_privacy_reference(optimizer_fn())
    if optimizer is None:  # the tape reference's gradient of the one batch
        return [g.numpy() for g in _tape_dp_gradient(model, x, y, dp_config(optimizer_fn()))]
    model.compile(optimizer=optimizer, loss=LOSS)
    captured = {id(v): tf.Variable(tf.zeros_like(v), trainable=False)
                for v in model.trainable_variables}
    apply_gradients = optimizer.apply_gradients

    def recording(grads_and_vars, *args, **kwargs):
        grads_and_vars = list(grads_and_vars)
        for grad, var in grads_and_vars:
            captured[id(var)].assign(grad)
        return apply_gradients(grads_and_vars, *args, **kwargs)

    object.__setattr__(optimizer, "apply_gradients", recording)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)
    return [captured[id(v)].numpy() for v in model.trainable_variables]


def test_adam_gets_the_same_dp_gradient_as_tf_privacy():
    # The gradient itself, not the update: a first Adam step maps a gradient
    # difference δ to about lr·δ/ε, so updates would compare float32 rounding.
    x, y = _data(_cnn())
    opt = lambda: DPKerasAdamOptimizer(l2_norm_clip=0.5, noise_multiplier=0.0,
                                       learning_rate=0.01, epsilon=1e-3)
    reference = _gradients_given_to_optimizer(_cnn, opt, False, x, y)
    ours = _gradients_given_to_optimizer(_cnn, opt, True, x, y)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


def test_noise_std_and_independence_with_secret_randomness():
    # update = -lr · noise / expected batch, noise ~ N(0, (σC)²) per coordinate.
    clip, sigma, expected = 0.7, 1.3, 10.0
    model = noise_statistics.zero_gradient_model()
    assert tf_tempered.privacy.has_secret_dp_randomness(model)
    updates = noise_statistics.noise_updates(model, clip=clip, sigma=sigma, steps=2,
                                             expected_batch=expected)
    std = sigma * clip / expected
    assert sum(u.size for u in updates[0]) == 2000 + 1200
    noise_statistics.assert_noise_updates(updates, std)


def test_global_seed_does_not_control_noise_but_insecure_dp_seed_does(monkeypatch):
    from tf_tempered.privacy import dp_seeds  # pylint: disable=import-outside-toplevel
    monkeypatch.setattr(dp_seeds, "_warned", False)

    def noise(**kwargs):
        keras.utils.set_random_seed(0)  # what --seed does: same initial weights ...
        model = noise_statistics.zero_gradient_model(**kwargs)
        initial = model.get_weights()
        return initial, noise_statistics.noise_updates(model, clip=1.0, sigma=1.0, steps=1)[0]

    (init_a, a), (init_b, b) = noise(), noise()
    for wa, wb in zip(init_a, init_b):
        np.testing.assert_array_equal(wa, wb)
    assert not any(np.array_equal(x, y) for x, y in zip(a, b))  # ... but secret noise
    with pytest.warns(errors.InsecureDPRandomnessWarning, match="does NOT hold"):
        _, c = noise(insecure_dp_seed=5)
    _, d = noise(insecure_dp_seed=5)
    _, e = noise(insecure_dp_seed=6)
    for x, y in zip(c, d):
        np.testing.assert_array_equal(x, y)  # the opt-in reproduces bit for bit
    assert not any(np.array_equal(x, y) for x, y in zip(c, e))
    assert not tf_tempered.privacy.has_secret_dp_randomness(noise_statistics.zero_gradient_model(
        insecure_dp_seed=5))


@pytest.mark.parametrize("bad", [1.5, "3", True])
def test_insecure_dp_seed_is_validated(bad):
    with pytest.raises(ValueError, match="insecure_dp_seed must be an integer or None"):
        make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]),
                     insecure_dp_seed=bad)


def test_has_secret_dp_randomness_needs_make_private():
    with pytest.raises(ValueError, match="make_private"):
        tf_tempered.privacy.has_secret_dp_randomness(
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]))


def test_history_reports_clipping_statistics():
    model = make_private(_cnn())
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1e-3, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    x, y = _data(model)
    history = model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0).history
    assert history["dp_clipped_fraction"] == [1.0, 1.0]
    assert all(n > 1e-3 for n in history["dp_grad_norm"])
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1e6, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    assert model.fit(x, y, batch_size=BATCH, verbose=0).history["dp_clipped_fraction"] == [0.0]


@pytest.mark.cover_each()
@pytest.mark.parametrize("forced", ["ghost", "materialize", "native", "native-materialized",
                                    "native-separate"])
def test_nonfinite_example_contributes_zero_and_is_counted(forced):
    if forced.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    # "native": one Conv2D's clipped sum fused with its norms (the default), "-separate" not.
    options = EngineOptions(norm_path=forced.split("-")[0], native_materialize_min_rows=(
        0 if forced == "native-materialized" else EngineOptions().native_materialize_min_rows),
        fused_clipped_sum=forced != "native-separate")
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0)
    clean, _ = _update(_cnn, opt, True, x[1:], y[1:], options=options)
    x_bad = x.copy()
    x_bad[0, 0, 0, 0] = np.nan
    model = make_private(_fresh(_cnn), options=options)
    model.compile(optimizer=opt(), loss=LOSS)
    before = model.get_weights()
    history = model.fit(x_bad, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert history["dp_nonfinite"] == [1.0]
    for c, after, b in zip(clean, model.get_weights(), before):
        assert np.all(np.isfinite(after))
        # Same clipped sum, divided by 16 microbatches instead of 15.
        np.testing.assert_allclose((after - b) * BATCH, c * (BATCH - 1), atol=1e-5)


def test_plain_optimizer_without_settings_is_refused_not_trained():
    # make_private(model) without settings and a plain optimizer: no clipping, no noise
    # would be a silent non-private run. Refused before any update, naming the fix.
    x, y = _data(_cnn())
    model = make_private(_fresh(_cnn))
    model.compile(optimizer=_plain_sgd(learning_rate=0.5), loss=LOSS)
    before = model.get_weights()
    with pytest.raises(NotPrivateError, match="WITHOUT differential privacy.*l2_norm_clip"):
        model.fit(x, y, batch_size=BATCH, verbose=0)
    with pytest.raises(NotPrivateError):  # train_on_batch runs the step itself
        model.train_on_batch(x, y)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_poisson_padding_rows_do_not_change_the_update():
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0)

    def run(xs, ys, mask):
        model = make_private(_fresh(_cnn))
        model.compile(optimizer=opt(), loss=LOSS, metrics=["accuracy"])
        before = model.get_weights()
        weights = {"mask": tf.constant(mask, tf.float32),
                   "expected_batch_size": tf.constant(10.0)}
        ds = tf.data.Dataset.from_tensors((xs, ys, weights))
        history = model.fit(ds, verbose=0).history
        # Accuracy over the real rows only (padded rows would count as examples).
        predicted = np.argmax(before_model.predict(xs[:8], verbose=0), 1)
        np.testing.assert_allclose(history["accuracy"][0], np.mean(predicted == ys[:8]))
        # The reported loss is the mean over real rows only.
        expected_loss = LOSS(ys[:8], before_model.predict(xs[:8], verbose=0)).numpy().mean()
        np.testing.assert_allclose(history["loss"][0], expected_loss, rtol=1e-5)
        return [a - b for a, b in zip(model.get_weights(), before)]

    before_model = _fresh(_cnn)
    real = run(x[:8], y[:8], np.ones(8))
    padded = run(np.concatenate([x[:8], np.zeros_like(x[:8])]), np.concatenate([y[:8], (y[:8] + 1) % 3]),
                 np.r_[np.ones(8), np.zeros(8)])
    for r, p in zip(real, padded):
        np.testing.assert_allclose(p, r, atol=1e-6)
    # Normalized by the expected batch size (10), not by the 8 real or 16 padded rows.
    reference, _ = _update(_cnn, opt, False, x[:8], y[:8])
    for r, ours in zip(reference, real):
        np.testing.assert_allclose(ours * 10, r * 8, atol=1e-5)


def test_dp_nonfinite_counts_real_examples_only():
    # keras.io's text classifier (Embedding(mask_zero=True) + GlobalAveragePooling1D) on a
    # Poisson batch: each all-zero padding row pools 0/0 = NaN. They were counted in
    # dp_nonfinite (333 "non-finite examples" an epoch where no real example was empty).
    model = keras.Sequential([keras.Input((4,), dtype="int32"),
                              keras.layers.Embedding(10, 3, mask_zero=True),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(2)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=0.0)
    model.compile(optimizer=_plain_sgd(learning_rate=0.1), loss=LOSS)
    tokens = np.array([[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0], [4, 5, 6, 0], [0, 0, 0, 0]])
    mask = np.array([1.0, 1.0, 1.0, 0.0, 0.0], np.float32)  # row 2: a real, empty example
    batch = (tokens, np.array([0, 1, 0, 1, 0]),
             {"mask": tf.constant(mask), "expected_batch_size": tf.constant(3.0)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        history = model.fit(tf.data.Dataset.from_tensors(batch), verbose=0).history
    assert history["dp_nonfinite"] == [1.0]  # the real empty example, not the padding row
    assert all(np.isfinite(w).all() for w in model.get_weights())


class _LossIgnoringWeights(keras.Model):
    """A compute_loss override that returns each example's loss and ignores sample_weight."""

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        del x, sample_weight, kwargs
        return keras.losses.sparse_categorical_crossentropy(y, y_pred, from_logits=True)


def _regularized_mlp():
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="tanh",
                                activity_regularizer=keras.regularizers.L2(0.5))(inputs)
    return keras.Model(inputs, keras.layers.Dense(3)(hidden))


def _mlp_ignoring_weights():
    inputs = keras.Input((5,))
    return _LossIgnoringWeights(inputs, keras.layers.Dense(3)(
        keras.layers.Dense(4, activation="tanh")(inputs)))


@pytest.mark.parametrize("model_fn", [_regularized_mlp, _mlp_ignoring_weights])
def test_no_loss_of_a_poisson_padding_row_reaches_the_update(model_fn):
    # The compiled loss is masked through sample_weight, but an activity penalty and a
    # compute_loss override ignoring sample_weight were not: every padding row's loss
    # joined the update (the padded batch, not the sampled one, and the sum moved by up to
    # 2C when an example replaced a padding row).
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(16, 5)).astype(np.float32), rng.integers(0, 3, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")

        def update(mask):
            model = make_private(_fresh(model_fn), l2_norm_clip=1e6, noise_multiplier=0.0)
            model.compile(optimizer=_plain_sgd(learning_rate=1.0), loss=LOSS)
            before = model.get_weights()
            weights = {"mask": tf.constant(mask, tf.float32),
                       "expected_batch_size": tf.constant(8.0)}
            model.fit(tf.data.Dataset.from_tensors((x, y, weights)), verbose=0)
            return [a - b for a, b in zip(model.get_weights(), before)]

        real = update(np.r_[np.ones(8), np.zeros(8)])
        every_row = update(np.ones(16))
    model = _fresh(model_fn)
    with tf.GradientTape() as tape:  # the first 8 rows' summed losses, / 8: the DP update
        logits = model(x[:8])
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y[:8], logits,
                                                                          from_logits=True))
        loss += sum(model.losses) * 8 if model_fn is _regularized_mlp else 0.0
    expected = [-g.numpy() / 8 for g in tape.gradient(loss, model.trainable_variables)]
    for ours, reference, both in zip(real, expected, every_row):
        np.testing.assert_allclose(ours, reference, rtol=1e-4, atol=1e-6)
        assert np.abs(both - ours).max() > 1e-4  # the other 8 rows do count when sampled


def test_unpadded_poisson_batches_train_as_the_padded_ones(recwarn):
    # poisson_batches(fixed_size=False): the same examples per step without padding rows;
    # the same update (σ = 0, the same insecure key for the membership), traced once.
    x, y = _data(_cnn(), seed=1)
    x, y = np.concatenate([x] * 4), np.concatenate([y] * 4)

    loss_calls = []  # Python runs the loss only while tracing: a count of traces

    def loss(labels, logits):
        loss_calls.append(1)
        return LOSS(labels, logits)

    def run(fixed_size):
        model = make_private(_fresh(_cnn))
        model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                                    learning_rate=1.0), loss=loss)
        before = model.get_weights()
        ds = tf_tempered.privacy.poisson_batches(x, y, expected_batch_size=8, steps=6,
                                                 insecure_dp_seed=5, fixed_size=fixed_size)
        after_first = keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: batch or traced.append(len(loss_calls)))
        traced = []
        history = model.fit(ds, epochs=2, verbose=0, callbacks=[after_first]).history
        sizes = {int(tf.reduce_sum(info["mask"])) for _, _, info in ds}
        return [a - b for a, b in zip(model.get_weights(), before)], history, traced, sizes

    padded, padded_history, _, _ = run(True)
    unpadded, unpadded_history, traced, sizes = run(False)
    for p, u in zip(padded, unpadded):
        assert np.abs(p).max() > 0
        np.testing.assert_allclose(u, p, atol=1e-5)
    # Poisson-accounted alike (the amplified ε); batches of several sizes traced once.
    assert unpadded_history["epsilon"] == padded_history["epsilon"]
    assert len(sizes) > 1 and 0 < traced[0] == traced[1] == len(loss_calls)


@pytest.mark.parametrize("physical", [None, "auto", 4])
def test_an_empty_poisson_batch_is_a_step_of_noise_alone(physical, monkeypatch):
    """Poisson sampling may draw no example (unpadded: a batch of 0 rows, its size known
    only in the step). The step is still taken: the update is Z / (q·N), the noise over the
    expected batch size, with nothing clipped (it divided by zero before). "auto" with a
    budget every batch exceeds, and 4, run it in chunks: none."""
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 1)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 1)
    def empty(a):  # no row, in a tensor of unknown batch size
        return tf.boolean_mask(a, tf.zeros(tf.shape(a)[:1], tf.bool))

    ds = tf.data.Dataset.from_tensors((np.ones((3, 40), np.float32), np.zeros(3, np.int64))).map(
        lambda a, b: (empty(a), empty(b), {"mask": empty(tf.ones(3)),
                                           "expected_batch_size": tf.constant(10.0)}))
    assert ds.element_spec[0].shape.as_list() == [None, 40]
    deltas = {}
    for sigma in (0.0, 2.0):
        model = make_private(keras.Sequential([keras.Input((40,)), keras.layers.Dense(100)]),
                             options=EngineOptions(physical_batch_size=physical))
        model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.5, noise_multiplier=sigma,
                                                    learning_rate=1.0), loss=LOSS)
        before = model.get_weights()
        logs = model.fit(ds, verbose=0).history
        deltas[sigma] = np.concatenate([(a - b).ravel()
                                        for a, b in zip(model.get_weights(), before)])
        assert np.isfinite(logs["loss"][0]) and logs["dp_clipped_fraction"][0] == 0.0
    assert not deltas[0.0].any()  # no example: no gradient
    # Z / 10 with Z ~ N(0, (σC)²) on each of the 4,100 coordinates: std 0.1.
    np.testing.assert_allclose(deltas[2.0].std(), 2.0 * 0.5 / 10, rtol=0.05)
    assert abs(deltas[2.0].mean()) < 0.01


def test_unpadded_poisson_batches_under_xla_warn_with_the_fix():
    x, y = _data(_cnn())
    for fixed_size, warns in ((True, False), (False, True)):
        model = make_private(_fresh(_cnn))
        model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                    learning_rate=0.1),
                      loss=LOSS, jit_compile=True)
        ds = tf_tempered.privacy.poisson_batches(x, y, expected_batch_size=8, steps=1,
                                                 fixed_size=fixed_size)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model.fit(ds, verbose=0)
        said = [str(w.message) for w in caught if "XLA compiles" in str(w.message)]
        assert bool(said) == warns
        if warns:
            assert "fixed_size=True" in said[0] and "jit_compile=False" in said[0]


def test_a_loss_function_reducing_over_the_batch_is_refused():
    model = make_private(_cnn())
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                learning_rate=0.1),
                  loss=lambda y, p: tf.reduce_mean(
                      keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True)))
    with pytest.raises(ValueError, match="one value for the whole batch.*axis=-1"):
        model.fit(*_data(model), batch_size=BATCH, verbose=0)


def test_indivisible_microbatches_are_refused_with_the_fix():
    model = make_private(_cnn())
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0,
                                                num_microbatches=5, learning_rate=0.1), loss=LOSS)
    x, y = _data(model)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    with pytest.raises(ValueError, match="num_microbatches=5 does not divide 16.*drop_remainder"):
        model.fit(ds, verbose=0)


def test_weight_regularizer_is_refused_before_any_update():
    model = make_private(keras.Sequential([
        keras.Input((4,)), keras.layers.Dense(3, kernel_regularizer=keras.regularizers.L2(0.1))]))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match="weight regularizers.*kernel_regularizer.*AdamW"):
        model.fit(np.ones((8, 4), np.float32), np.zeros(8), batch_size=8, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_batch_normalization_is_refused_in_training_mode():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              keras.layers.BatchNormalization()])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match="GroupNormalization"):
        model.fit(np.ones((8, 4), np.float32), np.zeros((8, 3)), batch_size=8, verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    model.layers[-1].trainable = False
    model.compile(optimizer="sgd", loss="mse")
    # Frozen, BN uses its moving statistics: no mixing.
    model.fit(np.ones((8, 4), np.float32), np.zeros((8, 3)), batch_size=8, verbose=0)


@pytest.mark.tf_privacy
def test_dp_config_reads_tf_privacy_optimizers():
    config = dp_config(tensorflow_privacy.DPKerasSGDOptimizer(
        l2_norm_clip=2.0, noise_multiplier=0.5, num_microbatches=8))
    assert (config.l2_norm_clip, config.noise_multiplier, config.num_microbatches) == (2.0, 0.5, 8)
    config = dp_config(tensorflow_privacy.VectorizedDPKerasSGDOptimizer(
        l2_norm_clip=3.0, noise_multiplier=1.5))
    assert (config.l2_norm_clip, config.noise_multiplier, config.num_microbatches) == (3.0, 1.5, None)
    assert dp_config(_plain_sgd()) is None


@pytest.mark.tf_privacy  # the tape reference would draw other dropout masks
def test_update_with_active_dropout_equals_tf_privacy():
    # A seeded Dropout draws the same mask in both models once the global seed is reset.
    def build(rate):
        return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                                 keras.layers.Dropout(rate, seed=3), keras.layers.Dense(3)])

    x = np.random.default_rng(0).normal(size=(BATCH, 6)).astype("float32")
    y = np.arange(BATCH) % 3
    initial = build(0.5).get_weights()

    def update(rate, private):
        keras.utils.set_random_seed(7)
        model = build(rate)
        model.set_weights(initial)
        if private:
            make_private(model)
        optimizer = DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=1.0)
        model.compile(optimizer=optimizer if private else _tf_privacy_reference(optimizer),
                      loss=LOSS)
        model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
        return [a - b for a, b in zip(model.get_weights(), initial)]

    reference, ours, without_dropout = update(0.5, False), update(0.5, True), update(0.0, False)
    scale = max(np.abs(r).max() for r in reference)
    # Dropout is active: it changes the update far beyond the tolerance below.
    assert max(np.abs(r - w).max() for r, w in zip(reference, without_dropout)) > 0.1 * scale
    for r, o in zip(reference, ours):
        np.testing.assert_allclose(o, r, rtol=0, atol=1e-5 * scale)


# Multi-replica training (MirroredStrategy, MultiWorkerMirroredStrategy): tests/test_distribute.py.


# --- DP settings given to make_private: any Keras optimizer ------------------------

def _optimizer_with_schedule():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.5, decay_steps=1, decay_rate=0.5)
    if KERAS_MAJOR == 3:
        return keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01)
    return keras.optimizers.legacy.Adam(learning_rate=schedule)


@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_settings_on_make_private_with_a_plain_optimizer(num_microbatches):
    # Plain SGD (lr 1): the update is minus the DP gradient, which the tape reference gives.
    x, y = _data(_cnn())
    dp_opt = DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                 num_microbatches=num_microbatches, learning_rate=1.0)
    model = make_private(_fresh(_cnn), l2_norm_clip=0.3, noise_multiplier=0.0,
                         num_microbatches=num_microbatches, sampling="shuffle")
    model.compile(optimizer=_plain_sgd(learning_rate=1.0), loss=LOSS)
    before = model.get_weights()
    history = model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0).history
    assert 0 < history["dp_clipped_fraction"][0] <= 1
    reference = _tape_dp_gradient(_fresh(_cnn), x, y, dp_config(dp_opt))
    for r, a, b in zip(reference, model.get_weights(), before):
        np.testing.assert_allclose(a - b, -r.numpy(), rtol=0, atol=1e-5 * np.abs(r).max() + 1e-9)


def test_settings_on_make_private_with_a_schedule_and_weight_decay():
    # The optimizer applies the DP gradient with its own rule: same as applying the
    # reference gradient with an identical optimizer.
    x, y = _data(_cnn())
    model = make_private(_fresh(_cnn), l2_norm_clip=0.3, noise_multiplier=0.0)
    model.compile(optimizer=_optimizer_with_schedule(), loss=LOSS)
    model.fit(x, y, batch_size=BATCH, shuffle=False, verbose=0)
    reference_model = _fresh(_cnn)
    grads = _tape_dp_gradient(reference_model, x, y, DPConfig(0.3, 0.0, None))
    _optimizer_with_schedule().apply_gradients(zip(grads, reference_model.trainable_variables))
    for ours, ref in zip(model.get_weights(), reference_model.get_weights()):
        np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-4)


def test_settings_given_twice_must_agree():
    x, y = _data(_cnn())
    model = make_private(_fresh(_cnn), l2_norm_clip=0.3, noise_multiplier=1.0)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.5, noise_multiplier=1.0), loss=LOSS)
    with pytest.raises(ValueError, match="give them once"):
        model.fit(x, y, batch_size=BATCH, verbose=0)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=1.0), loss=LOSS)
    assert "dp_grad_norm" in model.fit(x, y, batch_size=BATCH, verbose=0).history


@pytest.mark.parametrize("kwargs, match", [
    ({"l2_norm_clip": 1.0}, "not noise_multiplier"),
    ({"noise_multiplier": 1.0}, "not l2_norm_clip"),
    ({"num_microbatches": 4}, "num_microbatches without l2_norm_clip"),
    ({"l2_norm_clip": -1.0, "noise_multiplier": 1.0}, "l2_norm_clip must be"),
    ({"l2_norm_clip": 1.0, "noise_multiplier": float("nan")}, "noise_multiplier must be"),
    ({"l2_norm_clip": 1.0, "noise_multiplier": 1.0, "num_microbatches": 0}, "num_microbatches"),
])
def test_make_private_settings_are_validated(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]), **kwargs)


@pytest.mark.cover_each()
@pytest.mark.parametrize("num_microbatches", [None, 4])
def test_tf_ops_path_compiles_with_xla(num_microbatches):
    # The GPU path (no native op) under jit_compile=True: XLA-compiled, same update.
    x, y = _data(_cnn())
    opt = lambda: DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0,
                                      num_microbatches=num_microbatches, learning_rate=1.0)
    dp_opt = opt()
    model = make_private(_fresh(_cnn), options=EngineOptions(native=False))
    model.compile(optimizer=opt(), loss=LOSS, jit_compile=True)
    before = model.get_weights()
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)
    model.fit(data, verbose=0)
    assert model.train_function is not None
    reference = _tape_dp_gradient(_fresh(_cnn), x, y, dp_config(dp_opt))
    for r, a, b in zip(reference, model.get_weights(), before):
        np.testing.assert_allclose(a - b, -r.numpy(), rtol=0, atol=1e-5 * np.abs(r).max() + 1e-9)
