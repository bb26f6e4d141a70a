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
"""tf_tempered.privacy.keras_adapter: the methods make_private installs on one model."""

import json

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import keras_adapter, make_private
from tf_tempered.privacy.state import get_state

INSTALLED = ("train_step", "fit", "compile", "train_on_batch", "reset_metrics", "compute_loss",
             "compute_metrics")


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def test_methods_are_replaced_on_the_instance_only():
    private, plain = _model(), _model()
    make_private(private, l2_norm_clip=1.0, noise_multiplier=1.0)
    for name in INSTALLED:
        assert getattr(private, name).__func__ is getattr(keras_adapter, f"_{name}"), name
        assert getattr(plain, name).__func__ is getattr(type(plain), name), name
    keras_adapter.install(private)  # idempotent: still the adapter's, not wrapped twice
    assert private.fit.__func__ is keras_adapter._fit  # pylint: disable=protected-access


def test_compute_loss_takes_a_poisson_batch_weight_dict():
    model = _model()
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    x, y = tf.ones([3, 3]), tf.constant([0, 1, 0])  # tensors, as fit gives them
    y_pred = model(x)
    mask = tf.constant([1.0, 0.0, 1.0])
    poisson = model.compute_loss(x, y, y_pred, {"mask": mask, "expected_batch_size": 2.0})
    plain = model.compute_loss(x, y, y_pred, mask)
    np.testing.assert_allclose(poisson, plain)


def test_reset_metrics_resets_the_dp_metrics():
    model = _model()
    make_private(model, l2_norm_clip=1e-3, noise_multiplier=1.0)
    model.fit(np.ones((8, 3), np.float32), np.zeros(8), batch_size=4, verbose=0)
    metrics = get_state(model).metrics.all()
    assert any(float(m.result()) > 0 for m in metrics)  # the clip makes every row clipped
    model.reset_metrics()
    assert all(float(m.result()) == 0 for m in metrics)


def test_saved_description_holds_settings_and_ledger_never_the_key():
    model = _model()
    make_private(model, l2_norm_clip=0.7, noise_multiplier=1.2)
    model.fit(np.ones((8, 3), np.float32), np.zeros(8), batch_size=4, verbose=0)
    state = get_state(model)
    description = keras_adapter.saving_description(state)
    assert description["settings"] == {"l2_norm_clip": 0.7, "noise_multiplier": 1.2,
                                       "num_microbatches": None}
    assert description["sampling"] == "poisson"
    assert sum(s["steps"] for s in description["ledger"]["segments"]) == 2
    text = json.dumps(description)  # JSON as saved: no tensor, no variable
    key = state.noise._key.numpy()  # pylint: disable=protected-access
    assert all(str(int(k)) not in text for k in np.ravel(key))


class _OwnStep(keras.Model):
    """Keras' "Customizing what happens in fit()": a train_step of its own."""

    def __init__(self):
        super().__init__(name="own_step")
        self.dense = keras.layers.Dense(2)

    def call(self, x):
        return self.dense(x)

    def train_step(self, data):  # e.g. a loss scaled by 100: never run by a private fit
        raise AssertionError("the DP step replaced it")


class _KerasStep(_OwnStep):
    train_step = keras.Model.train_step  # Keras' own again: not an override


def test_a_class_with_its_own_train_step_is_refused_and_dpgradients_serves_it():
    from tf_tempered.privacy import DPGradients  # pylint: disable=g-import-not-at-top
    x = np.ones((4, 3), np.float32)
    model = _OwnStep()
    model(x)
    try:
        make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    except TypeError as error:
        assert str(error).startswith("_OwnStep.train_step would not run"), error
        assert "Fix: drop the train_step override" in str(error) and "DPGradients" in str(error)
    else:
        raise AssertionError("a train_step override was not refused")
    assert get_state(model) is None  # nothing installed
    dp = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     l2_norm_clip=1.0, noise_multiplier=1.0)
    grads, _ = dp(x, np.zeros(4, np.int64))
    assert [g.shape for g in grads] == [(3, 2), (2,)]
    keras_step = _KerasStep()
    keras_step(x)
    assert get_state(make_private(keras_step, l2_norm_clip=1.0, noise_multiplier=1.0))


def test_fit_of_a_dpgradients_model_with_its_own_train_step_is_refused():
    # DPGradients prepares such a class (its loop calls the DP step); fit then ran the DP
    # step on compile's loss and skipped the override's own loss and updates silently.
    from tf_tempered.privacy import DPGradients  # pylint: disable=g-import-not-at-top
    x, y = np.ones((4, 3), np.float32), np.zeros(4, np.int64)
    model = _OwnStep()
    model(x)
    DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = model.get_weights()
    for train in (lambda: model.fit(x, y, batch_size=4, verbose=0),
                  lambda: model.train_on_batch(x, y)):
        with pytest.raises(TypeError, match=r"_OwnStep\.train_step would not run.*Fix: drop "
                           "the train_step override.*an optimizer of your own"):
            train()
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


class _PassThroughFit(keras.Sequential):
    """A fit override as users write one: adds a callback, passes everything through."""

    def fit(self, *args, **kwargs):
        kwargs["callbacks"] = [*kwargs.get("callbacks", []), keras.callbacks.History()]
        return super().fit(*args, **kwargs)


def test_a_pass_through_fit_override_trains_with_the_dp_step():
    model = _PassThroughFit([keras.Input((3,)), keras.layers.Dense(2)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = np.ones((32, 3), np.float32), np.zeros(32, np.int64)
    history = model.fit(x, y, 8, epochs=2, verbose=0)  # batch_size given by position
    assert len(history.history["epsilon"]) == 2 and history.history["epsilon"][-1] > 0
    assert get_state(model).run is None and get_state(model).ledger.segments  # accounted
