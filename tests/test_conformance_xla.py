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
"""Every conformance case compiled with XLA (``jit_compile=True``): the TF-ops paths a GPU runs.

The engine's update with the default options, the whole step compiled by XLA, equals the
float64 per-microbatch reference (tests/conformance_harness.py), one example per
microbatch and a static batch. XLA compiles each model's step anew (seconds each), so the
whole matrix runs with --extended; the default run has two XLA exactness tests in
test_misuse_flows.py.
"""

import pytest

from conformance_cases import CASES
from conformance_harness import case_labels
from dp_reference import assert_engine_matches_reference, seeded
from dp_reference import skip_without_onednn_conv_gradients


@pytest.mark.extended
@pytest.mark.parametrize("case", list(CASES))
def test_xla_update_equals_per_microbatch_reference(case):
    conformance_case = CASES[case]
    if conformance_case.onednn_only:
        skip_without_onednn_conv_gradients()
    assert_engine_matches_reference(seeded(conformance_case.build), conformance_case.inputs(0),
                                    case_labels(), static_batch=True, jit_compile=True,
                                    cache_key=("conformance", case, None))
