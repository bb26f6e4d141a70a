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
"""ExponentialMovingAverage: the closed form on a linear loss, exact swap in/out, --ema_decay."""

import numpy as np
import pytest

import tf_tempered
from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.ema import ExponentialMovingAverage
from tf_tempered.experiments import train as train_lib
from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config

W0, LR, STEPS = 0.5, 0.01, 6


def _linear_model():
    """y = w·x with x = 1 and loss = mean(y): the gradient is 1 at every step."""
    keras.utils.set_random_seed(0)
    inputs = keras.Input(shape=(1,))
    outputs = keras.layers.Dense(1, use_bias=False,
                                 kernel_initializer=keras.initializers.Constant(W0))(inputs)
    model = keras.Model(inputs, outputs)
    sgd = keras.optimizers.legacy.SGD if KERAS_MAJOR == 2 else keras.optimizers.SGD
    model.compile(optimizer=sgd(learning_rate=LR), loss=lambda y, p: keras.ops.mean(p)
                  if KERAS_MAJOR == 3 else p)
    return model


def _closed_form(decay, steps, start_step=0):
    """shadow after `steps`: w_t = W0 − LR·t, shadow copies w up to start_step, then averages."""
    w = lambda t: W0 - LR * t  # noqa: E731
    shadow = w(min(start_step, steps))
    for t in range(start_step + 1, steps + 1):
        shadow = decay * shadow + (1 - decay) * w(t)
    return shadow


def _geometric_sum(decay, steps):
    """The same, summed: d^T w0 + (1 − d) Σ_t d^(T−t) (w0 − LR·t)."""
    t = np.arange(1, steps + 1)
    return decay ** steps * W0 + (1 - decay) * np.sum(decay ** (steps - t) * (W0 - LR * t))


@pytest.mark.parametrize("start_step", [0, 2])
def test_fit_ends_with_the_closed_form_average(start_step):
    decay = 0.8
    model = _linear_model()
    ema = ExponentialMovingAverage(decay=decay, start_step=start_step)
    x, y = np.ones((STEPS, 1), np.float32), np.zeros((STEPS, 1), np.float32)
    # Two epochs with validation in between: training resumes from the raw weights.
    history = model.fit(x, y, batch_size=1, epochs=2, validation_data=(x, y), callbacks=[ema],
                        shuffle=False, verbose=0)
    expected = _closed_form(decay, 2 * STEPS, start_step)
    if start_step == 0:
        assert expected == pytest.approx(_geometric_sum(decay, 2 * STEPS), rel=1e-12)
    assert ema.step == 2 * STEPS
    (kernel,) = model.get_weights()  # the model now holds the average
    assert kernel.item() == pytest.approx(expected, rel=1e-5)
    # Validation after epoch 1 saw the average then (loss = w·1), not the raw weight.
    assert history.history["val_loss"][0] == pytest.approx(
        _closed_form(decay, STEPS, start_step), rel=1e-5)
    assert history.history["val_loss"][1] == pytest.approx(expected, rel=1e-5)


def test_swap_in_and_out_restore_exactly():
    model = _linear_model()
    ema = ExponentialMovingAverage(decay=0.5)
    x = np.ones((3, 1), np.float32)
    model.fit(x, x, batch_size=1, epochs=1, callbacks=[ema], verbose=0)
    averaged = model.get_weights()[0].copy()
    raw = np.array([[0.123456789]], np.float32)
    model.set_weights([raw])
    ema.swap_in()
    np.testing.assert_array_equal(model.get_weights()[0], averaged)
    with pytest.raises(ValueError, match="already swapped in"):
        ema.swap_in()
    ema.swap_out()
    np.testing.assert_array_equal(model.get_weights()[0], raw)  # bit for bit
    with pytest.raises(ValueError, match="without swap_in"):
        ema.swap_out()


def test_arguments_are_validated():
    for bad in (0, 1, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match="decay="):
            ExponentialMovingAverage(decay=bad)
    with pytest.raises(ValueError, match="start_step=-1"):
        ExponentialMovingAverage(start_step=-1)
    with pytest.raises(ValueError, match="swap_for_validation='no'"):  # was taken as True
        ExponentialMovingAverage(swap_for_validation="no")
    with pytest.raises(ValueError, match="call fit"):
        ExponentialMovingAverage().shadow_weights()
    assert tf_tempered.ExponentialMovingAverage is ExponentialMovingAverage
    for bad in (1.0, -1.0, 1.5):
        with pytest.raises(ConfigError, match=f"--ema_decay={bad}.*or 0 \\(no averaging\\)"):
            validate_config(TrainConfig(ema_decay=bad))
    validate_config(TrainConfig(ema_decay=0.0))  # 0: no averaging (turns a recipe's off)


def test_train_flag_averages_and_the_saved_model_holds_the_average(tmp_path):
    config = TrainConfig(dataset="digits", epochs=1, batch_size=128, learning_rate=0.5,
                         ema_decay=0.9, validation_size=300,
                         output_dir=str(tmp_path))
    metrics = train_lib.run_training(config, verbose=0)
    assert metrics["flags"]["ema_decay"] == 0.9
    model = keras.models.load_model(tmp_path / "model.keras", compile=False)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    x, y = tf_tempered.data.load("digits").train
    _, val_acc = model.evaluate(x[-300:], y[-300:], verbose=0)
    assert val_acc == pytest.approx(metrics["validation_accuracy"], abs=1e-6)
    assert metrics["history"][-1]["validation_accuracy"] == pytest.approx(val_acc, abs=1e-6)


def test_train_script_averages_only_for_a_positive_decay():
    report = keras.callbacks.Callback()
    for decay, averaged in ((None, False), (0.0, False), (0.99, True)):
        callbacks, _ = train_lib._callbacks(TrainConfig(dpsgd=False, ema_decay=decay),
                                            None, 0, report, None)
        emas = [c for c in callbacks if isinstance(c, ExponentialMovingAverage)]
        assert len(emas) == averaged and (not emas or emas[0].decay == decay), decay
