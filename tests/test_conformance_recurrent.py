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
"""Conformance of the recurrent handlers (rnn_rows, conv_lstm, and the recurrent unit's VJP).

SimpleRNN, LSTM, GRU (backwards, unrolled, masked, Bidirectional, with states in and out,
shared by two calls), ConvLSTM1D/2D/3D (strided, dilated, backwards, with states in and
out, on every path of the convolution handlers), and subclasses with a call of their own
(the recurrent unit's per-example VJP, vectorized or by tf.map_fn), against the float64
per-microbatch reference: the "recurrent" family of tests/conformance_cases.py on
tests/conformance_harness.py.
"""

from conformance_harness import family_tests

FAMILY = "recurrent"


(test_handler_update_equals_per_microbatch_reference,
 test_two_pass_clipped_sum_equals_per_microbatch_reference,
 test_each_layer_takes_its_handler) = family_tests(FAMILY)
