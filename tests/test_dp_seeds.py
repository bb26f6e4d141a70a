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
"""tf_tempered.privacy.dp_seeds: secret seeds, the insecure_dp_seed opt-in, its warning."""

import warnings

import numpy as np
import pytest

from tf_tempered.privacy import dp_seeds, errors, randomness

# Keras-independent code: runs in the Keras 3 suite (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


@pytest.fixture
def fresh_warning(monkeypatch):
    """Re-arms the once-per-process warning of the insecure opt-in."""
    monkeypatch.setattr(dp_seeds, "_warned", False)


@pytest.mark.parametrize("bad", [1.5, "7", True, [1]])
def test_insecure_dp_seed_must_be_an_int(bad):
    with pytest.raises(ValueError, match="insecure_dp_seed must be an integer or None"):
        randomness.DPRandomness("noise", insecure_dp_seed=bad)
    assert randomness.check_insecure_dp_seed(np.int64(4)) == 4


def test_the_opt_in_warns_once_per_process(fresh_warning):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        randomness.DPRandomness("noise", insecure_dp_seed=1)
        randomness.DPRandomness("poisson", insecure_dp_seed=1)
        randomness.dp_seed("shuffle", insecure_dp_seed=1)
    insecure = [w for w in caught if issubclass(w.category,
                                                errors.InsecureDPRandomnessWarning)]
    assert len(insecure) == 1 and "the ε does NOT hold" in str(insecure[0].message)


def test_dp_seed_is_secret_or_derived_from_the_opt_in(fresh_warning):
    assert dp_seeds.dp_seed("shuffle") != dp_seeds.dp_seed("shuffle")  # fresh OS entropy
    with pytest.warns(errors.InsecureDPRandomnessWarning, match="does NOT hold"):
        seed = dp_seeds.dp_seed("shuffle", insecure_dp_seed=1)
    assert 0 <= seed < 2 ** 63 and seed == dp_seeds.dp_seed("shuffle", insecure_dp_seed=1)
    assert seed != dp_seeds.dp_seed("feature_stats", insecure_dp_seed=1)
    assert seed != dp_seeds.dp_seed("shuffle", insecure_dp_seed=2)
