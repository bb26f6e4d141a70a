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
"""class_weight on fit: arrays and Poisson pipelines weigh each example by its class."""

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import make_private, poisson_batches

pytestmark = pytest.mark.filterwarnings("ignore:noise_multiplier=0", "ignore:fit on a pipeline")

_INITIAL = [np.array([[0.5, -0.3, 0.1], [0.2, 0.4, -0.6], [-0.1, 0.3, 0.2], [0.7, -0.2, 0.0]],
                     np.float32), np.array([0.1, -0.1, 0.0], np.float32)]
_CLASSES = {0: 2.0, 1: 1.0, 2: 0.25}


def _update(dataset, class_weight=None):
    """One fit on ``dataset`` (noise 0, SGD at lr 1): the weights' change."""
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.set_weights(_INITIAL)
    make_private(model, l2_norm_clip=0.5, noise_multiplier=0.0)
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(dataset, class_weight=class_weight, verbose=0)
    return [a - b for a, b in zip(model.get_weights(), _INITIAL)]


def _poisson_batch(x, y, mask, sample_weight=None):
    info = {"mask": tf.constant(mask, tf.float32), "expected_batch_size": tf.constant(5.0)}
    if sample_weight is not None:
        info["sample_weight"] = tf.constant(sample_weight, tf.float32)
    return tf.data.Dataset.from_tensors((x, y, info))


@pytest.mark.parametrize("user_weights", [False, True], ids=["class-weights", "times-sample-weights"])
def test_class_weight_on_a_poisson_pipeline_weighs_each_example_by_its_class(user_weights):
    # Keras took the batch's info dict for sample weights: Keras 3 refused "class_weight and
    # sample_weight at the same time", Keras 2 failed on the dict's missing dtype.
    rng = np.random.default_rng(0)
    x = rng.normal(size=(8, 4)).astype(np.float32)
    y = np.array([0, 1, 2, 0, 2, 1, 0, 0])  # the last two rows: padding (zeros, as poisson_batches pads)
    mask = np.r_[np.ones(6), np.zeros(2)]
    user = rng.uniform(0.5, 1.5, 8).astype(np.float32) if user_weights else np.ones(8, np.float32)
    by_class = np.array([_CLASSES.get(int(c), 0.0) for c in y], np.float32)
    ours = _update(_poisson_batch(x, y, mask, user if user_weights else None), _CLASSES)
    expected = _update(_poisson_batch(x, y, mask, user * by_class))
    unweighted = _update(_poisson_batch(x, y, mask, user))
    for o, e, u in zip(ours, expected, unweighted):
        np.testing.assert_allclose(o, e, rtol=1e-6, atol=1e-7)
    assert max(np.abs(o - u).max() for o, u in zip(ours, unweighted)) > 1e-3


def test_class_weight_on_poisson_batches_without_a_class_s_weight_is_refused_naming_the_fix():
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 3, 40)
    with pytest.raises(tf.errors.InvalidArgumentError, match="no weight for a class.*Fix"):
        _update(poisson_batches(x, y, expected_batch_size=20, steps=2), {0: 1.0, 1: 1.0})
    before = _update(poisson_batches(x, y, expected_batch_size=20, steps=2), _CLASSES)
    assert all(np.isfinite(b).all() for b in before)


def test_class_weight_on_distributed_poisson_batches_is_refused_naming_sample_weight():
    # Before: an AttributeError ('DistributedDatasetsFromFunction' has no 'map'; probe B2, F2).
    from tf_tempered.privacy import distributed_poisson_batches  # pylint: disable=import-outside-toplevel
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 5)).astype(np.float32), rng.integers(0, 3, 32)
    with strategy.scope():
        model = make_private(keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)]),
                             l2_norm_clip=1.0, noise_multiplier=1.0)
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    data = distributed_poisson_batches(strategy, x, y, expected_batch_size=8, steps=4)
    with pytest.raises(ValueError, match=r"class_weight with batches .*Fix: drop class_weight.*"
                                         r"sample_weight="):
        model.fit(data, epochs=1, steps_per_epoch=4, class_weight={0: 0.5, 1: 1.0, 2: 2.0},
                  verbose=0)


@pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3's fit takes no tf.data iterator")
def test_class_weight_on_an_iterator_of_poisson_batches_is_refused_naming_the_dataset():
    # Before: refused, but the message spoke of a tf.distribute dataset (probe E3, S3).
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(40, 4)).astype(np.float32), rng.integers(0, 3, 40)
    with pytest.raises(ValueError, match=r"an iterator of Poisson batches.*Fix: fit on the "
                                         r"dataset itself"):
        _update(iter(poisson_batches(x, y, expected_batch_size=20, steps=2)), _CLASSES)
