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
"""Sensitivity of one DP step, for every handler: neighbouring batches move the sum by ≤ C.

For each conformance case (tests/conformance_cases.py, every family: every registered
handler, the generic fallback, the recurrent units), one DP step on a Poisson batch
holding example k and one on the same batch with k masked out (the padding of Poisson
batches), from the same noise (the same insecure key and counter): the noised sums
(the update times the expected batch size) must differ by example k's clipped gradient,
so by at most C, and by more than 0 when its gradient is not zero. Both steps run in one
traced function (the same graph for both batches: no data-dependent control flow).
This is what DP-SGD's guarantee rests on (Cebere et al. 2026 found 13 violations of it
in 12 libraries with this gray-box test).
"""

import numpy as np
import pytest

from dp_reference import BATCH, seeded, skip_without_onednn_conv_gradients
from conformance_cases import CASES
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPGradients, EngineOptions
from tf_tempered.privacy.state import get_state

K = 5  # the example that is in one batch and not in the other


def _step_pair(case, clip):
    model = seeded(CASES[case].build)("float32")
    x = CASES[case].inputs(1)
    x = x.astype(np.float32) if x.dtype.kind == "f" else x
    y = np.random.default_rng(2).integers(0, 3, BATCH)
    # The recurrent units' per-example VJP by tf.map_fn: the same values, traced in
    # seconds rather than the vectorized VJP's tens of seconds.
    options = EngineOptions(vectorize_recurrent=False) if CASES[case].recurrent_vjp else None
    dp = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     l2_norm_clip=clip, noise_multiplier=1.0, insecure_dp_seed=7,
                     options=options)
    noise = get_state(model).noise

    @tf.function
    def noised_sum(mask):
        info = {"mask": mask, "expected_batch_size": tf.constant(float(BATCH))}
        grads, _ = dp(x, y, sample_weight=info)
        return [g * BATCH for g in grads]  # the update times the normaliser

    with_k = np.ones(BATCH, np.float32)
    without_k = with_k.copy()
    without_k[K] = 0.0
    noise._counter.assign(0)  # pylint: disable=protected-access
    a = [t.numpy() for t in noised_sum(tf.constant(with_k))]
    noise._counter.assign(0)  # the same noise draw  # pylint: disable=protected-access
    b = [t.numpy() for t in noised_sum(tf.constant(without_k))]
    assert noised_sum.experimental_get_tracing_count() == 1
    return model, a, b


@pytest.mark.parametrize("case", sorted(CASES))
def test_neighbouring_batches_move_the_noised_sum_by_at_most_the_clip_norm(case):
    if CASES[case].onednn_only:
        skip_without_onednn_conv_gradients()
    clip = 0.05  # small: example k's gradient is clipped, its contribution has norm C
    model, a, b = _step_pair(case, clip)
    difference = np.sqrt(sum(np.sum((p - q).astype(np.float64) ** 2) for p, q in zip(a, b)))
    assert 0 < difference <= clip * (1 + 1e-4), difference
    assert difference == pytest.approx(clip, rel=1e-3)  # clipped: exactly C
    assert len(a) == len(model.trainable_variables)
    assert all(np.isfinite(t).all() for t in a + b)
