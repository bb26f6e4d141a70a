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
"""Conformance of the Conv2DTranspose handler (strided, output_padding, dilated).

The handler, on every path it can take, against the float64 per-microbatch reference:
the "conv_transpose" family of tests/conformance_cases.py on tests/conformance_harness.py
(the dilated case needs oneDNN: tests/test_conformance_matrix.py runs it in a subprocess
where this process cannot); and the float64 stand-in of its reference checked against
the dilated layer itself.
"""

import numpy as np
from conformance_cases import _dilated_conv_transpose, _floats
from conformance_harness import family_tests
from dp_reference import seeded, skip_without_onednn_conv_gradients

FAMILY = "conv_transpose"


(test_handler_update_equals_per_microbatch_reference,
 test_two_pass_clipped_sum_equals_per_microbatch_reference,
 test_each_layer_takes_its_handler) = family_tests(FAMILY)


def test_zero_inserted_conv2d_transpose_is_the_dilated_one():
    skip_without_onednn_conv_gradients()
    x = _floats((4, 3, 2), 0).astype("float32")
    ours, theirs = seeded(_dilated_conv_transpose)("float32"), seeded(_dilated_conv_transpose)(
        "float64")
    theirs.set_weights(ours.get_weights())
    np.testing.assert_allclose(theirs(x.astype("float64")).numpy(), ours(x).numpy(), rtol=1e-5,
                               atol=1e-6)
