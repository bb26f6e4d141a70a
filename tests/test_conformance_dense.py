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
"""Conformance of the row handlers: Dense, EinsumDense, a transformer block, LoRA variants.

Each handler, on every path it can take, against the float64 per-microbatch reference:
the "dense" family of tests/conformance_cases.py on tests/conformance_harness.py; and a
Dense MLP on [B, d] inputs with and without microbatches, on the same reference.
"""

import warnings

import numpy as np
import pytest

from conformance_harness import BATCH_KINDS, SOME_MICROBATCHES, family_tests, random_batch
from dp_reference import (assert_engine_matches_reference, assert_update, median_clip,
                          per_example_reference, seeded, sparse_crossentropy_mean)
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import EngineOptions, make_private

FAMILY = "dense"


(test_handler_update_equals_per_microbatch_reference,
 test_two_pass_clipped_sum_equals_per_microbatch_reference,
 test_each_layer_takes_its_handler) = family_tests(FAMILY)


# --- Per-path reference: a Dense MLP, microbatches -----------------------------
# (Keras 3 suite: on Keras 2 the cases above and the comparisons with TF Privacy stand in,
# tests/conftest.py.)

def _mlp(dtype):
    return keras.Sequential([
        keras.Input((6,), dtype=dtype),
        keras.layers.Dense(5, activation="tanh", dtype=dtype),
        keras.layers.Dense(3, dtype=dtype),
    ])


@pytest.mark.keras3_suite
@pytest.mark.cover_each()
@BATCH_KINDS
@SOME_MICROBATCHES
@pytest.mark.parametrize("forced", [None, "ghost", "materialize"])
def test_dense_microbatches_equal_reference(forced, num_microbatches, static_batch):
    options = EngineOptions(norm_path=forced or "auto")
    x, y = random_batch((6,))
    assert_engine_matches_reference(seeded(_mlp), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch, options=options)


def _sequence_classifier(dtype="float32"):
    return keras.Sequential([keras.Input((None, 3), dtype=dtype),
                             keras.layers.Dense(4, activation="tanh", dtype=dtype),
                             keras.layers.GlobalAveragePooling1D(dtype=dtype),
                             keras.layers.Dense(3, dtype=dtype)])


# Before: a Dense on [B, None, d] with the batch's length unknown too (padded_batch of
# variable-length sequences) failed with TypeError in rows_path.static_rows (probe P3, F4).
def test_a_dense_on_sequences_and_batches_of_unknown_length_trains_exactly():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(6, 5, 3)).astype(np.float32), np.arange(6) % 3
    weights = _sequence_classifier().get_weights()
    norms, reference = per_example_reference(_sequence_classifier, weights, x, y,
                                             sparse_crossentropy_mean)
    clip = median_clip(norms)
    model = _sequence_classifier()
    model.set_weights(weights)
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    before = [v.numpy() for v in model.trainable_variables]
    batches = tf.data.Dataset.from_generator(lambda: iter([(x, y)]), output_signature=(
        tf.TensorSpec([None, None, 3], tf.float32), tf.TensorSpec([None], tf.int64)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (the batches' sampling is the user's)
        model.fit(batches, verbose=0)
    assert_update([v.numpy() - b for v, b in zip(model.trainable_variables, before)],
                  reference(clip))
