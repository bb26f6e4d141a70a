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
"""Where a warning raised deep in fit points: the user's line, not a module of this
library, Keras or TensorFlow (whose wrappers sit between a user's ``model.fit`` and the
code that plans its data, a different number of frames on each Keras).

>>> user_stacklevel()  # called from outside them: the caller's own line
1
"""

import os

from tf_tempered import keras_bridge

__all__ = ["user_stacklevel"]

_PACKAGES = ("tf_tempered", "keras", "tf_keras", "tensorflow")


def user_stacklevel():
    """The ``stacklevel`` for ``warnings.warn`` called by this function's caller that
    names the first frame outside this library, Keras and TensorFlow (1: the caller)."""
    def users(frame):
        path = frame.f_code.co_filename
        return (not keras_bridge.is_library_file(path, _PACKAGES)
                and "__autograph_generated" not in os.path.abspath(path))
    return keras_bridge.first_frame_level(users) or 1
