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
"""tf_tempered.privacy.step.chunks: EngineOptions(physical_batch_size=P).

A step in chunks must give the whole batch's update and logs: each case trains the same
seeded model one step with noise 0 on the whole batch and in chunks, and compares the
weights and every logged value. Then what chunks refuse, and that they run one at a time
(peak memory, in a fresh process with TF's CPU allocator statistics).
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from tf_tempered import augment
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import DPGradients, DPKerasSGDOptimizer, EngineOptions, make_private
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step import chunk_sizes, chunks
from tf_tempered.privacy.step.chunks import even_chunk_examples

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
RNG = np.random.default_rng(0)
X = RNG.normal(size=(24, 6, 6, 2)).astype(np.float32)
Y = RNG.integers(0, 3, 24)
WEIGHT = RNG.uniform(0.0, 2.0, 24).astype(np.float32)


def _model(physical=None, *, multiplicity=None, num_microbatches=None, jit_compile=False,
           run_eagerly=False):
    keras.utils.set_random_seed(7)
    model = keras.Sequential([
        keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, activation="tanh"),
        keras.layers.Flatten(), keras.layers.Dense(5, activation="tanh"), keras.layers.Dense(3)])
    make_private(model, options=EngineOptions(physical_batch_size=physical),
                 augmentation_multiplicity=multiplicity)
    # A clip norm most examples exceed: the factors c_m differ, as they must for the test.
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=0.2, noise_multiplier=0.0, learning_rate=0.5,
                                      num_microbatches=num_microbatches),
                  loss=LOSS, metrics=["accuracy"], jit_compile=jit_compile,
                  run_eagerly=run_eagerly)
    return model


def _step(model, data):
    logs = model.fit(data, epochs=1, verbose=0).history
    return model.get_weights(), {k: v[0] for k, v in logs.items() if k not in ("epsilon", "delta")}


def _assert_same_step(whole, chunked):
    (w_whole, logs_whole), (w_chunked, logs_chunked) = whole, chunked
    for a, b in zip(w_whole, w_chunked):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert sorted(logs_chunked) == sorted(logs_whole)
    for key, value in logs_whole.items():
        np.testing.assert_allclose(logs_chunked[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    # The step moved the weights: the comparison is not of two untrained models.
    assert max(float(np.abs(a - b).max()) for a, b in zip(w_whole, _initial_weights())) > 1e-3


def _initial_weights():
    return _model().get_weights()


def _batches(rows=24, weight=False, known_rows=True):
    data = (X[:rows], Y[:rows]) + ((WEIGHT[:rows],) if weight else ())
    dataset = tf.data.Dataset.from_tensor_slices(data)
    if known_rows:
        return dataset.batch(rows, drop_remainder=True)
    return dataset.batch(rows)  # first axis unknown while tracing


def test_even_split_sizes():
    assert even_chunk_examples(300, 128) == 100
    assert even_chunk_examples(256, 128) == 128
    assert even_chunk_examples(256, 100) == 64
    assert even_chunk_examples(23, 8) is None  # 23 is prime: only chunks of one
    assert even_chunk_examples(24, 7) == 6


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("rows,physical,known_rows,weight", [
    (24, 8, True, False),    # three equal chunks, static shapes
    (24, 5, True, True),     # six chunks of 4 (an even split), with sample weights
    (23, 8, True, False),    # chunks of 8, 8 and 7
    (24, 7, False, True),    # the batch size unknown while tracing: chunks of 7, 7, 7, 3
])
def test_chunks_give_the_whole_batch_step(rows, physical, known_rows, weight):
    data = _batches(rows, weight, known_rows)
    _assert_same_step(_step(_model(), data), _step(_model(physical), data))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_batch_no_larger_than_a_chunk_runs_whole():
    data = _batches(8)
    _assert_same_step(_step(_model(), data), _step(_model(8), data))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_of_a_padded_poisson_batch():
    """Padding rows (mask 0) are in some chunks: the normaliser is still q·N, the loss and
    the accuracy those of the sampled rows only."""
    mask = (RNG.uniform(size=24) < 0.7).astype(np.float32)
    mask[-5:] = 0.0  # padding at the end, as poisson_batches pads
    weights = {"mask": mask, "expected_batch_size": np.full(24, 15.0, np.float32)}
    data = tf.data.Dataset.from_tensors((X, Y, weights)).map(
        lambda x, y, w: (x, y, dict(w, expected_batch_size=w["expected_batch_size"][0])))
    _assert_same_step(_step(_model(), data), _step(_model(6), data))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_keep_an_examples_augmented_copies_together():
    """augmentation_multiplicity=2: 24 rows are 12 examples; chunks of 4 examples (8 rows)."""
    data = augment.declare_copies(_batches(24), multiplicity=2)
    _assert_same_step(_step(_model(multiplicity=2), data), _step(_model(4, multiplicity=2), data))


@pytest.mark.keras3_suite  # the engine's chunks; an eager step on Keras 2: test_eager_passes
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_run_eagerly():
    data = _batches(24)
    _assert_same_step(_step(_model(), data), _step(_model(8, run_eagerly=True), data))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_under_xla_and_refused_when_they_cannot_be_equal():
    _assert_same_step(_step(_model(), _batches(24)), _step(_model(8, jit_compile=True),
                                                          _batches(24)))
    with pytest.raises(ValueError, match=r"physical_batch_size=8.*jit_compile=True.*23 rows.*"
                                         r"Fix: a batch size that splits into equal chunks"):
        _step(_model(8, jit_compile=True), _batches(23))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_with_two_outputs_log_each_outputs_loss():
    def model(physical):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((4,))
        hidden = keras.layers.Dense(5, activation="tanh")(inputs)
        outputs = [keras.layers.Dense(3, name="a")(hidden), keras.layers.Dense(2, name="b")(hidden)]
        m = keras.Model(inputs, outputs)
        make_private(m, options=EngineOptions(physical_batch_size=physical))
        m.compile(DPKerasSGDOptimizer(l2_norm_clip=0.3, noise_multiplier=0.0, learning_rate=0.5),
                  loss=[LOSS, LOSS])
        return m

    x = RNG.normal(size=(12, 4)).astype(np.float32)
    data = tf.data.Dataset.from_tensors((x, (Y[:12], Y[:12] % 2)))
    whole, chunked = _step(model(None), data), _step(model(4), data)
    assert len(whole[1]) > 5  # the per-output losses are logged
    for a, b in zip(whole[0], chunked[0]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    for key, value in whole[1].items():
        np.testing.assert_allclose(chunked[1][key], value, rtol=1e-5, atol=1e-6, err_msg=key)


class SubclassedModel(keras.Model):
    """A subclassed model: Keras knows no static shapes of its layers' calls. (Not
    underscored: Keras 3 names the model after its class, and a name scope cannot start
    with "_".)"""

    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(4, activation="tanh")
        self.out = keras.layers.Dense(3)

    def call(self, x):
        return self.out(self.hidden(x))


def _compiled(model, physical, *, clip=0.1, **options):
    make_private(model, options=EngineOptions(physical_batch_size=physical, **options))
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0, learning_rate=0.5),
                  loss=LOSS)
    return model


def _assert_whole_and_chunks_agree(build, data):
    """One step of ``build(None)`` (the whole batch) and of ``build(8)`` (chunks of 8), each
    from the same seed: the same weights and logs."""
    def step(physical):
        keras.utils.set_random_seed(1)
        return _step(build(physical), data)

    (whole, whole_logs), (chunked, chunked_logs) = step(None), step(8)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    assert chunked_logs == pytest.approx(whole_logs, rel=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("clipped_sum", ["bookkeeping", "second_pass", "recompute"])
def test_each_clipped_sum_in_chunks_with_an_embedding(clipped_sum):
    """An Embedding's clipped sum is sparse rows; each strategy's, added over chunks."""
    _assert_whole_and_chunks_agree(lambda physical: _compiled(keras.Sequential([
        keras.Input((5,), dtype="int32"), keras.layers.Embedding(50, 4), keras.layers.Flatten(),
        keras.layers.Dense(3)]), physical, clipped_sum=clipped_sum),
        tf.data.Dataset.from_tensors((RNG.integers(0, 50, (24, 5)), Y)))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("unit", ["LSTM", "GRU"])
def test_chunks_of_a_recurrent_classifier(unit):
    """Embedding + LSTM/GRU (their own time loops, native on CPU) inside the chunks' loop."""
    _assert_whole_and_chunks_agree(lambda physical: _compiled(keras.Sequential([
        keras.Input((6,), dtype="int32"), keras.layers.Embedding(30, 4, mask_zero=True),
        getattr(keras.layers, unit)(5), keras.layers.Dense(3)]), physical, clip=0.05),
        tf.data.Dataset.from_tensors((RNG.integers(1, 30, (24, 6)), Y)))


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_of_a_subclassed_model_built_by_its_first_step():
    _assert_whole_and_chunks_agree(lambda physical: _compiled(SubclassedModel(), physical),
                                   tf.data.Dataset.from_tensors((X.reshape(24, -1), Y)))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_chunks_of_fit_on_arrays_with_a_string_loss(policy):
    """fit on arrays (Poisson batches, padded, drawn alike with one insecure seed), a loss
    given by name, under mixed precision too: chunks give the whole batch's training."""
    def fit(physical):
        keras.utils.set_random_seed(7)
        keras.mixed_precision.set_global_policy(policy)
        try:
            model = keras.Sequential([
                keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3, activation="tanh"),
                keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax",
                                                           dtype="float32")])
        finally:
            keras.mixed_precision.set_global_policy("float32")
        make_private(model, l2_norm_clip=0.2, noise_multiplier=0.0, insecure_dp_seed=11,
                     options=EngineOptions(physical_batch_size=physical))
        sgd = keras.optimizers.SGD if KERAS_MAJOR == 3 else keras.optimizers.legacy.SGD
        model.compile(sgd(0.5), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        initial = model.get_weights()
        history = model.fit(X, Y, batch_size=12, epochs=2, verbose=0).history
        return initial, model.get_weights(), {k: v[-1] for k, v in history.items()}

    (initial, whole, whole_logs), (_, chunked, chunked_logs) = fit(None), fit(5)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-6)
    assert chunked_logs == pytest.approx(whole_logs, rel=1e-5, abs=1e-6)
    assert max(float(np.abs(a - b).max()) for a, b in zip(whole, initial)) > 1e-3


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_chunks_follow_freezing_and_unfreezing_with_several_steps_per_execution():
    """A frozen layer stays put in chunks too; unfrozen (recompiled), it trains as in the
    whole batch; four steps per call of the train function."""
    x, y = RNG.normal(size=(48, 6)).astype(np.float32), RNG.integers(0, 3, 48)
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(12)

    def fit(physical):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, activation="tanh"),
                                  keras.layers.Dense(3)])
        make_private(model, options=EngineOptions(physical_batch_size=physical))
        frozen = model.layers[0].get_weights()
        logs = []
        for trainable in (False, True):
            model.layers[0].trainable = trainable
            model.compile(DPKerasSGDOptimizer(l2_norm_clip=0.1, noise_multiplier=0.0,
                                              learning_rate=0.5),
                          loss=LOSS, metrics=["accuracy"], steps_per_execution=4)
            history = model.fit(data, epochs=1, verbose=0).history
            logs.append({k: v[0] for k, v in history.items()})
            if not trainable:
                for a, b in zip(frozen, model.layers[0].get_weights()):
                    np.testing.assert_array_equal(b, a)
        return model.get_weights(), logs

    (whole, whole_logs), (chunked, chunked_logs) = fit(None), fit(5)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    for one, other in zip(whole_logs, chunked_logs):
        assert other == pytest.approx(one, rel=1e-5)


def test_dp_gradients_in_chunks():
    def gradients(physical):
        keras.utils.set_random_seed(5)
        model = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3),
                                  keras.layers.Flatten(), keras.layers.Dense(3)])
        dp = DPGradients(model, LOSS, l2_norm_clip=0.2, noise_multiplier=0.0,
                         options=EngineOptions(physical_batch_size=physical))
        grads, logs = tf.function(dp)(X, Y)
        return [g.numpy() for g in grads], {k: float(v) for k, v in logs.items()}

    (whole, whole_logs), (chunked, chunked_logs) = gradients(None), gradients(10)
    for a, b in zip(whole, chunked):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    assert chunked_logs == pytest.approx(whole_logs, rel=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_the_option_is_saved_with_the_model_and_loaded_chunks_train_alike(tmp_path):
    model = _model(8)
    _step(model, _batches(24))
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    make_private(loaded)  # without arguments: the settings saved with it
    assert get_state(loaded).options.physical_batch_size == 8
    # The loaded model's next step in chunks is the original's next step.
    _assert_same_step(_step(model, _batches(24)), _step(loaded, _batches(24)))


def test_kept_bytes_per_row_from_static_shapes():
    model = _model()
    # Conv2D: input 6·6·2, output 4·4·4; Dense(5): 64 → 5; Dense(3): 5 → 3 (float32).
    assert chunk_sizes.kept_bytes_per_row(model) == 4 * (72 + 64 + 64 + 5 + 5 + 3)

    # An LSTM(3) over 7 steps of 2 features also keeps each step's row: x_t (2), the gate
    # gradients δa_t and δr_t (4·3 each) and h_{t-1} (3) (layer_grads/rnn_rows.py).
    recurrent = keras.Sequential([keras.Input((7, 2)), keras.layers.LSTM(3), keras.layers.Dense(2)])
    assert chunk_sizes.kept_bytes_per_row(recurrent) == 4 * (14 + 3 + 7 * (2 + 24 + 3) + 3 + 2)

    subclassed = SubclassedModel()
    subclassed(np.zeros((2, 4), np.float32))
    assert chunk_sizes.kept_bytes_per_row(subclassed) is None  # no static shapes: never "auto"
    sequence = keras.Sequential([keras.Input((None,)), keras.layers.Embedding(10, 4),
                                 keras.layers.Dense(2)])
    assert chunk_sizes.kept_bytes_per_row(sequence) is None


def test_auto_chunks_are_equal_and_never_below_the_minimum():
    # The largest equal chunk within the budget; else the smallest equal chunk of at least
    # AUTO_MIN_CHUNK (64) examples: a padded Poisson batch of 380 in 5 chunks of 76, not
    # 10 of 38; no equal split (a prime), or fewer than two minimum chunks: whole.
    assert chunk_sizes.auto_chunk_examples(256, 64) == 64
    assert chunk_sizes.auto_chunk_examples(256, 100) == 64  # 85.3 is no equal chunk
    assert chunk_sizes.auto_chunk_examples(380, 64) == 76
    assert chunk_sizes.auto_chunk_examples(380, 84) == 76
    assert chunk_sizes.auto_chunk_examples(4096, 2048) == 2048
    assert chunk_sizes.auto_chunk_examples(1100, 600) == 550
    assert chunk_sizes.auto_chunk_examples(257, 64) is None
    assert chunk_sizes.auto_chunk_examples(127, 64) is None


def test_auto_chunk_size():
    model = _model()
    per_row = chunk_sizes.kept_bytes_per_row(model)
    assert chunk_sizes.auto_physical_batch_size(model, chunk_sizes.AUTO_CHUNK_BYTES // per_row, 1) is None
    many = 100 * chunk_sizes.AUTO_CHUNK_BYTES // per_row
    assert chunk_sizes.auto_physical_batch_size(model, many, 1) == chunk_sizes.AUTO_CHUNK_BYTES // per_row
    halved = chunk_sizes.AUTO_CHUNK_BYTES // per_row // 2  # two rows per example
    assert chunk_sizes.auto_physical_batch_size(model, many, 2) == halved


def _spy_chunked(monkeypatch):
    """Records (rows per chunk, equal) of every chunked trace of the step."""
    calls = []
    real_chunked = chunks._chunked  # pylint: disable=protected-access

    def spy(*args, **kwargs):
        calls.append((args[6], kwargs["equal"]))
        return real_chunked(*args, **kwargs)

    monkeypatch.setattr(chunks, "_chunked", spy)
    return calls


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.keras3_suite  # the engine's chunk plan: the same on either Keras
def test_auto_chunks_a_batch_whose_kept_tensors_exceed_the_budget(monkeypatch):
    """With the budget at 10 rows' kept tensors and chunks of at least 4 examples, the
    default ("auto") splits 24 rows into 3 equal chunks of 8; the step is the whole batch's."""
    per_row = chunk_sizes.kept_bytes_per_row(_model())
    whole = _step(_model(), _batches(24))
    calls = _spy_chunked(monkeypatch)
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 10 * per_row)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 4)
    _assert_same_step(whole, _step(_model("auto"), _batches(24)))
    assert calls and set(calls) == {(8, True)}  # (each trace of the step)
    traced = len(calls)
    # Under the budget, or with an unknown batch size: the whole batch.
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 24 * per_row)
    _step(_model("auto"), _batches(24))
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 10 * per_row)
    _step(_model("auto"), _batches(24, known_rows=False))
    assert len(calls) == traced


@pytest.mark.keras3_suite  # the engine's chunk plan: the same on either Keras
def test_auto_runs_the_whole_batch_under_xla(monkeypatch):
    """Over the budget, "auto" chunks a static batch outside XLA and not under it (XLA's CPU
    backend ran the CIFAR-10 CNN's step 22x slower in chunks); an explicit size still does."""
    per_row = chunk_sizes.kept_bytes_per_row(_model())
    calls = _spy_chunked(monkeypatch)
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 10 * per_row)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 4)
    whole = _step(_model(None, jit_compile=True), _batches(24))
    _assert_same_step(whole, _step(_model("auto", jit_compile=True), _batches(24)))
    assert not calls
    _step(_model(8, jit_compile=True), _batches(24))
    assert calls and set(calls) == {(8, True)}


def _recurrent(layer, steps=7):
    return keras.Sequential([keras.Input((steps, 2)), layer, keras.layers.Dense(3)])


def test_auto_chunks_recurrent_rows_only_where_the_time_loop_is_native(monkeypatch):
    """An LSTM's (or GRU's) time steps over AUTO_RECURRENT_CHUNK_BYTES: chunks, if its loop
    is the native op (in chunks no slower); TF's while loop: whole."""
    lstm = _recurrent(keras.layers.LSTM(3))
    per_row = chunk_sizes.time_step_bytes_per_row(lstm)
    assert per_row == 4 * 7 * (2 + 24 + 3)
    # Far under the other budget: only the recurrent one decides.
    assert chunk_sizes.kept_bytes_per_row(lstm) * 96 < chunk_sizes.AUTO_CHUNK_BYTES
    monkeypatch.setattr(chunk_sizes, "AUTO_RECURRENT_CHUNK_BYTES", 10 * per_row)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 4)
    assert chunk_sizes.auto_physical_batch_size(lstm, 96, 1) == 10
    assert chunk_sizes.auto_physical_batch_size(lstm, 96, 2) == 5  # two rows per example
    assert chunk_sizes.auto_physical_batch_size(lstm, 10, 1) is None  # within the budget
    assert chunk_sizes.auto_physical_batch_size(lstm, 96, 1, EngineOptions(native=False)) is None
    gru = _recurrent(keras.layers.GRU(3))
    assert chunk_sizes.auto_physical_batch_size(gru, 96, 1) == 10 * per_row // (
        chunk_sizes.time_step_bytes_per_row(gru))
    # reset_after=False: U's 2T rows (h_{t-1} and r_t ⊙ h_{t-1}), T·(D + 3G + 2U) floats.
    reset_before = _recurrent(keras.layers.GRU(3, reset_after=False))
    assert chunk_sizes.time_step_bytes_per_row(reset_before) == 4 * 7 * (2 + 27 + 6)
    assert chunk_sizes.auto_physical_batch_size(reset_before, 96, 1) == 10 * per_row // (
        chunk_sizes.time_step_bytes_per_row(reset_before))
    assert chunk_sizes.auto_physical_batch_size(
        _recurrent(keras.layers.GRU(3, reset_after=False, activation="relu")), 96, 1) is None
    assert chunk_sizes.auto_physical_batch_size(
        _recurrent(keras.layers.SimpleRNN(3)), 96, 1) is None
    assert chunk_sizes.auto_physical_batch_size(
        _recurrent(keras.layers.LSTM(3, activation="relu")), 96, 1) is None
    masked = keras.Sequential([keras.Input((7,), dtype="int32"),
                               keras.layers.Embedding(10, 2, mask_zero=True),
                               keras.layers.LSTM(3), keras.layers.Dense(3)])
    assert chunk_sizes.time_step_bytes_per_row(masked) == per_row
    assert chunk_sizes.auto_physical_batch_size(masked, 96, 1) is None  # a mask: TF's loop
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        half = _recurrent(keras.layers.LSTM(3))
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert chunk_sizes.auto_physical_batch_size(half, 96, 1) is None


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_auto_chunks_of_a_native_lstm_give_the_whole_batch_step(monkeypatch):
    def step(physical):
        keras.utils.set_random_seed(1)
        model = _compiled(_recurrent(keras.layers.LSTM(5), steps=6), physical, clip=0.05)
        return _step(model, tf.data.Dataset.from_tensors((X.reshape(24, 6, -1)[..., :2], Y)))

    whole = step(None)
    calls = _spy_chunked(monkeypatch)
    per_row = 4 * 6 * (2 + 2 * 20 + 5)
    monkeypatch.setattr(chunk_sizes, "AUTO_RECURRENT_CHUNK_BYTES", 8 * per_row)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 4)
    chunked = step("auto")
    assert calls and set(calls) == {(8, True)}
    for a, b in zip(whole[0], chunked[0]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    assert chunked[1] == pytest.approx(whole[1], rel=1e-5)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.keras3_suite  # the engine's chunk plan: the same on either Keras
def test_auto_chunks_a_batch_of_unknown_size_if_any_splittable_batch_is_over_budget(
        monkeypatch):
    """Budget 6 rows, chunks of at least 4 examples: any batch of 8 or more examples is
    over it, so a batch whose size is known only when the step runs goes in chunks too
    (24 rows: 4 of 6, sizes computed in the step); the step is the whole batch's."""
    per_row = chunk_sizes.kept_bytes_per_row(_model())
    whole = _step(_model(), _batches(24, known_rows=False))
    calls = _spy_chunked(monkeypatch)
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 6 * per_row)
    monkeypatch.setattr(chunk_sizes, "AUTO_MIN_CHUNK", 4)
    _assert_same_step(whole, _step(_model("auto"), _batches(24, known_rows=False)))
    # A size from the step (a tensor), the last chunk shorter.
    assert calls and {(isinstance(rows, int), equal) for rows, equal in calls} == {(False, False)}
    traced = len(calls)
    # Budget 10 rows: a batch of 8 examples would run whole, so an unknown size does.
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 10 * per_row)
    _step(_model("auto"), _batches(24, known_rows=False))
    # Under XLA an unknown size runs whole ("auto" chunks are equal there).
    monkeypatch.setattr(chunk_sizes, "AUTO_CHUNK_BYTES", 6 * per_row)
    _step(_model("auto", jit_compile=True), _batches(24, known_rows=False))
    assert len(calls) == traced


def test_auto_is_the_default():
    assert EngineOptions().physical_batch_size == "auto"


def test_refused_with_microbatches_of_several_examples():
    with pytest.raises(ValueError, match=r"physical_batch_size=8.*num_microbatches=4.*Fix: "
                                         r"num_microbatches=None"):
        _step(_model(8, num_microbatches=4), _batches(24))


@pytest.mark.parametrize("value", [0, -3, 2.5, True, "64"])
def test_option_is_validated(value):
    with pytest.raises(ValueError,
                       match='physical_batch_size must be an integer >= 1, "auto" or None'):
        EngineOptions(physical_batch_size=value)


MEMORY_CHILD = r'''
import json
import numpy as np
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private
x = np.random.default_rng(0).normal(size=(64, 32, 32, 3)).astype(np.float32)
y = np.zeros(64, np.int64)
data = tf.data.Dataset.from_tensors((x, y))
peaks = {}
for physical in (None, 16):
    model = keras.Sequential([keras.Input((32, 32, 3)), keras.layers.Conv2D(32, 3, padding="same",
                              activation="tanh"), keras.layers.Conv2D(32, 3, padding="same",
                              activation="tanh"), keras.layers.GlobalAveragePooling2D(),
                              keras.layers.Dense(10)])
    make_private(model, options=EngineOptions(physical_batch_size=physical))
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.0, learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    model.fit(data, epochs=1, verbose=0)  # trace and warm up
    tf.config.experimental.reset_memory_stats("CPU:0")
    base = tf.config.experimental.get_memory_info("CPU:0")["current"]
    model.fit(data, epochs=1, verbose=0)
    peaks[str(physical)] = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
print(json.dumps(peaks))
'''


@pytest.mark.keras3_suite  # the engine's chunk plan: the same on either Keras
def test_chunks_run_one_at_a_time():
    """Four chunks of 16 examples: the step's peak is far below the whole batch's (the
    activations of two 32-channel 32×32 convolutions, 8 MiB each at 64 examples); chunks
    whose passes overlapped (a while loop's parallel iterations) would not lower it."""
    import json  # pylint: disable=g-import-not-at-top
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, TF_CPP_MIN_LOG_LEVEL="3",
               TF_CPU_ALLOCATOR_USE_BFC="true")
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=300, check=True)
    peaks = json.loads(out.stdout.strip().splitlines()[-1])
    assert peaks["None"] > 16 * 2**20, peaks
    assert peaks["16"] < 0.35 * peaks["None"], peaks  # 0.22 measured; 0.50 overlapped
