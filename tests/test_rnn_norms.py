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
"""tf_tempered.privacy.layer_grads.rnn_norms: the recurrent kernels' shared norms.

Exactness end to end is the conformance test's (test_conformance_recurrent.py: cases
rnn_rows*, with the ghost path forced, so the GRU's shared-gates ghost norm and the
stacked LSTM kernel run on small shapes too); the identity itself is the module's doctest.
Here: which path each layer takes on the shapes people train.
"""

import types

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, layer_paths, make_private
from tf_tempered.privacy.layer_grads import rnn_norms


def _layout(examples_per_microbatch=1, **options):
    return types.SimpleNamespace(options=EngineOptions(**options),
                                 examples_per_microbatch=examples_per_microbatch)


def _gru_rows(steps, d, units, batch=2):
    x = tf.zeros([batch, steps, d])
    return x, tf.zeros([batch, steps, units]), tf.zeros([batch, steps, 3 * units])


@pytest.mark.parametrize("steps,d,units,options,chosen", [
    (64, 64, 64, {}, False),      # the benchmark's GRU: a tie, 64²·384 = 64·3·64·128 (measured)
    (32, 64, 64, {}, True),       # shorter sequences: the ghost norm costs half
    (5, 3, 3, {}, False),         # a short sequence: materializing both kernels costs less
    (5, 3, 3, {"norm_path": "ghost"}, True),
    (64, 64, 64, {"norm_path": "materialize"}, False),
])
def test_gru_shared_ghost_by_cost(steps, d, units, options, chosen):
    x, h, g = _gru_rows(steps, d, units)
    assert rnn_norms._shared_ghost_chosen(x, h, g, _layout(**options)) is chosen  # pylint: disable=protected-access


def test_unknown_length_does_not_take_the_ghost_norm():
    layout = _layout()
    @tf.function(input_signature=[tf.TensorSpec([2, None, 4]), tf.TensorSpec([2, None, 4]),
                                  tf.TensorSpec([2, None, 12])])
    def chosen(x, h, g):
        assert rnn_norms._shared_ghost_chosen(x, h, g, layout) is False  # pylint: disable=protected-access
        return tf.constant(0)

    chosen.get_concrete_function()


@pytest.mark.parametrize("unit,path", [
    (keras.layers.LSTM, "RNNRowsPath(inputs=RowsPath(materialize=False), recurrent='stacked with inputs')"),
    (keras.layers.GRU, "RNNRowsPath(inputs='shared gates ghost', recurrent='shared gates ghost')"),
])
def test_text_classifier_shapes_take_the_shared_paths(unit, path):
    model = keras.Sequential([keras.Input((32,), dtype="int32"), keras.layers.Embedding(100, 64),
                              unit(64), keras.layers.Dense(3)])
    make_private(model, options=EngineOptions(native=False))
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0, learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    rng = np.random.default_rng(0)
    model.train_on_batch(rng.integers(0, 100, (4, 32)), rng.integers(0, 3, 4))
    found = {p["class"]: p["path"] for p in layer_paths(model)}
    assert found[unit.__name__] == path
