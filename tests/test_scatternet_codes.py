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
"""The 8-bit logarithmic codes of cached ScatterNet features (scatternet/codes.py)."""

import numpy as np
import pytest

from tf_tempered._compat import tf
from tf_tempered.scatternet import codes

# Keras-independent code: runs in the Keras 3 suite (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def test_every_code_reads_back_as_itself():
    values = codes.code_values()
    assert values.shape == (256,) and values[0] == 0 and values[255] == 1
    # Each code's value encodes to that code: the table and the encoder agree.
    np.testing.assert_array_equal(codes.encode(values), np.arange(256))
    np.testing.assert_allclose(values[1:], 2.0 ** ((np.arange(1, 256) - 255) / 16), rtol=1e-6)


def test_relative_error_within_half_a_step_over_the_range():
    x = np.exp2(np.random.default_rng(0).uniform(-15.8, 0, 100_000)).astype(np.float32)
    read = codes.decode(codes.encode(x))
    assert np.abs(read / x - 1).max() <= 2 ** (1 / 32) - 1 + 1e-6  # 2.2%
    # Outside the range: small and negative values (float rounding) read 0, large ones 1.
    np.testing.assert_array_equal(
        codes.decode(codes.encode(np.array([1e-6, 0.0, -1e-4, 1.0, 3.0], np.float32))),
        [0, 0, 0, 1, 1])


def test_tensor_decoding_matches_the_table():
    q = np.arange(256, dtype=np.uint8).reshape(2, 8, 16)
    np.testing.assert_allclose(codes.decode_tensor(tf.constant(q)).numpy(), codes.decode(q),
                               rtol=1e-6, atol=0)
    assert codes.decode_tensor(tf.constant(q)).dtype == tf.float32
