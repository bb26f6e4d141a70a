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
"""tf_tempered/privacy/microbatching.py: a batch whose rows M microbatches do not divide gets
the message naming the fix before anything reshapes it."""

import numpy as np
import pytest

from tf_tempered._compat import tf
from tf_tempered.privacy import microbatching

pytestmark = pytest.mark.keras3_suite  # TF ops only: no Keras version in it


# Before: only the losses waited for the check, and a layer's reshape of its recorded inputs
# into microbatches often ran first: a bare "Input to reshape ..." error (3 runs of 4).
def test_every_use_of_the_inputs_waits_for_the_check_of_their_rows():
    @tf.function(input_signature=[tf.TensorSpec((None, 5))])
    def reshaped(x):
        x = microbatching.inputs_checked(x, num_microbatches=4)
        return tf.reshape(x, [4, -1, 5])

    assert reshaped(np.ones((8, 5), np.float32)).shape == (4, 2, 5)
    for _ in range(5):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="num_microbatches=4 does not divide a short batch"):
            reshaped(np.ones((6, 5), np.float32))


def test_static_or_single_example_rows_are_left_alone():
    x = tf.ones((6, 5))
    assert microbatching.inputs_checked(x, num_microbatches=None) is x
    assert microbatching.inputs_checked(x, num_microbatches=4) is x  # static: checked at trace
