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
"""The small data, model and expected ε that tests/test_callbacks.py and
tests/test_budget_settings.py train PrivacyBudget with: N = 64 examples, batches of 16
(4 steps an epoch), δ = 1e-3."""

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private
from tf_tempered.privacy.accounting import compute_epsilon

N, BATCH, DELTA = 64, 16, 1e-3  # 4 steps per epoch


def data(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 3, size=n)


def model(optimizer):
    """Dense(3) on 4 inputs, compiled with ``optimizer`` (ours: made private first)."""
    dense = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    if isinstance(optimizer, DPKerasSGDOptimizer):  # ours: only trains with make_private
        make_private(dense)
    dense.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"))
    return dense


def expected(epochs, sigma, microbatch_size=1, steps_per_epoch=N // BATCH):
    """ε after each of ``epochs`` epochs, by the accountant PrivacyBudget uses."""
    return [compute_epsilon(num_examples=N, batch_size=BATCH, noise_multiplier=sigma,
                            steps=k * steps_per_epoch, delta=DELTA,
                            microbatch_size=microbatch_size) for k in range(1, epochs + 1)]
