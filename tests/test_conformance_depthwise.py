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
"""Conformance of the depthwise handlers (DepthwiseConv2D, SeparableConv2D).

Each handler, on every path it can take (the folded backprop in one call or in chunks,
image patches; SeparableConv2D's pointwise part also by ghost norms), against the float64
per-microbatch reference: the "depthwise" family of tests/conformance_cases.py on
tests/conformance_harness.py.
"""

import pytest

from conformance_harness import (HANDLER_COVER, case_names, check_handler_update,
                                 check_layers_take_their_handlers, check_two_pass_update,
                                 handler_params, two_pass_params)

FAMILY = "depthwise"


@pytest.mark.cover_each(*HANDLER_COVER)
@pytest.mark.parametrize("case,path,num_microbatches,static_batch", handler_params(FAMILY))
def test_handler_update_equals_per_microbatch_reference(case, path, num_microbatches,
                                                        static_batch):
    check_handler_update(case, path, num_microbatches, static_batch)


# The default run: each mode with each (M, batch kind) once over all the families
# (conformance_harness.two_pass_params).
@pytest.mark.parametrize("mode,case,num_microbatches,static_batch", two_pass_params(FAMILY))
def test_two_pass_clipped_sum_equals_per_microbatch_reference(mode, case, num_microbatches,
                                                              static_batch):
    check_two_pass_update(mode, case, num_microbatches, static_batch)


@pytest.mark.parametrize("case", case_names(FAMILY))
def test_each_layer_takes_its_handler(case):
    check_layers_take_their_handlers(case)
