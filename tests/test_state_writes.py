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
"""tf_tempered/privacy/state_writes.py: a forward pass writing the batch's data into a
variable (a running mean of a layer's inputs, a stateful RNN's states) is refused before any
update; writes that do not depend on the batch pass."""

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import NotPrivateError, epsilon_spent, make_private


class _RunningMean(keras.layers.Layer):
    """A Dense-like layer counting its calls and keeping a running mean of its inputs."""

    def __init__(self, keep_mean=True):
        super().__init__()
        self.keep_mean = keep_mean

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), initializer="glorot_uniform",
                                 name="w")
        self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False,
                                     name="calls")
        self.mean = self.add_weight(shape=(input_shape[-1],), initializer="zeros",
                                    trainable=False, name="mean")

    def call(self, x, training=None):  # pylint: disable=arguments-differ
        if training:
            self.calls.assign_add(1.0)
            if self.keep_mean:
                self.mean.assign(0.9 * self.mean + 0.1 * tf.reduce_mean(x, 0))
        return tf.matmul(x - self.mean, self.w)


def _fit(model, x, y, train_on_batch=False, run_eagerly=False):
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", run_eagerly=run_eagerly)
    if train_on_batch:
        return model.train_on_batch(x, y)
    return model.fit(x, y, batch_size=8, verbose=0)


# Before: it trained with ε 4.73 reported while the running mean held 0.1 · example 0's raw
# features (the generic path ran the call again on one example). Run eagerly, the refusal
# came after the forward pass had written 0.1 · the batch's mean (a probe).
@pytest.mark.parametrize("run_eagerly", [False, True])
@pytest.mark.parametrize("train_on_batch", [False, True])
def test_a_running_mean_of_the_inputs_is_refused_before_any_update(train_on_batch, run_eagerly):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype(np.float32) + 3, rng.normal(size=(8, 3))
    model = keras.Sequential([keras.Input((5,)), _RunningMean(), keras.layers.Dense(3)])
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(NotPrivateError, match=r"writes values computed from the training batch "
                       r"into a variable, a summary or a print \(.*running_mean.*\).*Fix: keep "
                       r"no statistics"):
        _fit(model, x, y, train_on_batch, run_eagerly)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
    assert epsilon_spent(model)[0] == 0


def test_a_model_built_by_its_first_eager_step_writes_nothing_before_the_refusal():
    # Before: tf-keras built the model by an eager pass, checked after it: the running mean
    # held 0.1 · the batch's mean when the refusal came (probe G3, F6). The eager step's
    # passes are a traced function now, refused before it runs.
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype(np.float32) + 3, rng.normal(size=(8, 3))
    model = keras.Sequential([_RunningMean(), keras.layers.Dense(3)])  # no Input: unbuilt
    with pytest.raises(NotPrivateError, match=r"writes values computed from the training batch"):
        _fit(model, x, y, run_eagerly=True)
    running_mean = model.layers[0]
    assert running_mean.built
    assert float(running_mean.calls.numpy()) == 0.0
    np.testing.assert_array_equal(running_mean.mean.numpy(), np.zeros(5, np.float32))


def test_a_write_that_does_not_depend_on_the_batch_trains():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(8, 3))
    layer = _RunningMean(keep_mean=False)
    model = keras.Sequential([keras.Input((5,)), layer, keras.layers.Dropout(0.5),
                              keras.layers.Dense(3)])
    _fit(model, x, y)
    assert float(layer.calls.numpy()) >= 1 and not layer.mean.numpy().any()
    assert epsilon_spent(model)[0] > 0



class _Writes(keras.layers.Layer):
    """A Dense-like layer writing the batch somewhere: a queue, inside a tf.cond, a summary."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), initializer="glorot_uniform",
                                 name="w")
        self.queue = self.add_weight(shape=(32, input_shape[-1]), initializer="zeros",
                                     trainable=False, name="queue")

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (3,)

    def call(self, x):  # pylint: disable=arguments-differ
        if self.how == "queue":  # MoCo-style: the batch's rows into a slice of the queue
            self.queue[0:4].assign(x[:4])
        elif self.how == "cond":  # ActNorm-style data-dependent initialization
            def initialize():
                self.queue.assign(tf.tile(x[:1], [32, 1]))
                return tf.constant(0)
            tf.cond(tf.reduce_all(tf.equal(self.queue, 0.0)), initialize,
                    lambda: tf.constant(1))
        elif self.how == "print":
            tf.print(x[0])
        return tf.matmul(x, self.w)


# Before: each trained silently (the queue held example 0's exact values; tf.print printed it).
@pytest.mark.parametrize("how", ["queue", "cond", "print"])
def test_writes_of_the_batch_anywhere_in_the_forward_pass_are_refused(how):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=(8, 3))
    model = keras.Sequential([keras.Input((5,)), _Writes(how), keras.layers.Dense(3)])
    with pytest.raises(NotPrivateError, match=r"writes values computed from the training batch "
                       r"into a variable, a summary or a print"):
        _fit(model, x, y)
