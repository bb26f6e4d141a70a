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
"""keras_bridge.build_compiled_state: a private fit traces the DP step once, with the metrics
Keras itself would have built (Keras 3; on Keras 2 it builds nothing)."""

import numpy as np
import pytest

from tf_tempered import keras_bridge
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private, poisson_batches
from tf_tempered.privacy.step import keras_step

keras3_only = pytest.mark.skipif(KERAS_MAJOR != 3, reason="Keras 2 builds nothing here")


def _model(outputs=3):
    inputs = keras.Input((5,))
    hidden = keras.layers.Dense(4, activation="tanh")(inputs)
    return keras.Model(inputs, keras.layers.Dense(outputs)(hidden))


def _compile(model, metrics, loss="sparse_categorical_crossentropy", private=True):
    if private:
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)
        optimizer = DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                        learning_rate=0.1)
    else:
        optimizer = keras.optimizers.SGD(0.1)
    model.compile(optimizer, loss=loss, metrics=metrics)
    return model


def _metric_names(model):
    """Each compiled metric as class:name:function (the function tells which accuracy)."""
    metrics = model._compile_metrics.metrics  # pylint: disable=protected-access
    return sorted(f"{type(m).__name__}:{m.name}:{getattr(getattr(m, '_fn', None), '__name__', '')}"
                  for m in metrics)


def _count_traces(monkeypatch):
    traces = []
    step = keras_step.train_step

    def counted(model, data):
        traces.append(1)
        return step(model, data)

    monkeypatch.setattr(keras_step, "train_step", counted)
    return traces


@keras3_only
@pytest.mark.parametrize("data", ["arrays", "poisson_dataset"])
def test_private_fit_traces_the_dp_step_once(monkeypatch, data):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=[64, 5]).astype(np.float32), rng.integers(0, 3, 64)
    model = _compile(_model(), ["accuracy"])
    traces = _count_traces(monkeypatch)
    if data == "arrays":
        history = model.fit(x, y, batch_size=16, epochs=2, verbose=0)
    else:
        history = model.fit(poisson_batches(x, y, expected_batch_size=16, epochs=2), epochs=2, verbose=0)
    # Without the compiled metrics built first, tf.function traces it twice (the first
    # trace creates the metrics' variables).
    assert len(traces) == 1
    assert all(0.0 <= a <= 1.0 for a in history.history["accuracy"])


@keras3_only
@pytest.mark.parametrize("labels,outputs,loss", [
    ("sparse", 3, "sparse_categorical_crossentropy"),
    ("one_hot", 3, "categorical_crossentropy"),
    ("binary", 1, "binary_crossentropy"),
])
def test_metrics_are_the_ones_keras_builds(labels, outputs, loss):
    rng = np.random.default_rng(1)
    x = rng.normal(size=[32, 5]).astype(np.float32)
    y = {"sparse": rng.integers(0, 3, 32),
         "one_hot": np.eye(3, dtype=np.float32)[rng.integers(0, 3, 32)],
         "binary": rng.integers(0, 2, [32, 1]).astype(np.float32)}[labels]
    metrics = {"sparse": ["accuracy"], "one_hot": ["accuracy", "mse"],
               "binary": ["accuracy", keras.metrics.AUC(name="auc")]}[labels]
    private = _compile(_model(outputs), metrics, loss)
    assert keras_bridge.build_compiled_state(private, (
        tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None, *y.shape[1:]], y.dtype)))
    built_first = _metric_names(private)
    private.fit(x, y, batch_size=8, epochs=1, verbose=0)
    keras_own = _compile(_model(outputs), metrics, loss, private=False)
    keras_own.fit(x, y, batch_size=8, epochs=1, verbose=0)  # Keras resolves them in its trace
    assert built_first == _metric_names(private) == _metric_names(keras_own)
    expected = {"sparse": "sparse_categorical_accuracy", "one_hot": "categorical_accuracy",
                "binary": "binary_accuracy"}[labels]
    assert any(name.endswith(f":accuracy:{expected}") for name in built_first)


@keras3_only
def test_multi_output_model_builds_its_per_output_loss_trackers(monkeypatch):
    inputs = keras.Input((5,))
    model = keras.Model(inputs, {"a": keras.layers.Dense(3, name="a")(inputs),
                                 "b": keras.layers.Dense(1, name="b")(inputs)})
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.1)
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.1),
                  loss={"a": "sparse_categorical_crossentropy", "b": "mse"},
                  metrics={"a": ["accuracy"]})
    rng = np.random.default_rng(2)
    x = rng.normal(size=[32, 5]).astype(np.float32)
    y = {"a": rng.integers(0, 3, 32), "b": rng.normal(size=[32, 1]).astype(np.float32)}
    traces = _count_traces(monkeypatch)
    history = model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert len(traces) == 1
    assert {"a_accuracy", "a_loss", "b_loss"} <= set(history.history)


def test_nothing_is_built_without_labels_or_plain_tensors():
    model = _compile(_model(), ["accuracy"])
    x_spec = tf.TensorSpec([None, 5], tf.float32)
    assert not keras_bridge.build_compiled_state(model, None)
    assert not keras_bridge.build_compiled_state(model, x_spec)  # no labels
    assert not keras_bridge.build_compiled_state(
        model, (x_spec, tf.RaggedTensorSpec([None, None], tf.int64)))
    if KERAS_MAJOR == 3:
        assert not model._compile_metrics.built  # pylint: disable=protected-access
        assert keras_bridge.build_compiled_state(model, (x_spec, tf.TensorSpec([None], tf.int64)))
        assert not keras_bridge.build_compiled_state(  # already built
            model, (x_spec, tf.TensorSpec([None], tf.int64)))


@keras3_only
def test_nothing_is_built_under_a_distribution_strategy():
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    with strategy.scope():
        model = _compile(_model(), ["accuracy"])
    assert not keras_bridge.build_compiled_state(
        model, (tf.TensorSpec([None, 5], tf.float32), tf.TensorSpec([None], tf.int64)))
