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
"""The DP engine's error types: a leaf module (imports nothing from the package).

Every module may raise these; messages name what is wrong and the fix.
"""

__all__ = ["UnsupportedLayerError", "UnsupportedEinsumError", "NotPrivateError",
           "ScalarLossError", "NativeBuildError", "InsecureDPRandomnessWarning"]


class UnsupportedLayerError(ValueError):
    """A layer whose per-example gradients the DP engine cannot compute exactly."""

    # Raised while Keras traces the train step; autograph re-raises an error as
    # its own type only if its constructor is Exception's (else StagingError).
    __init__ = Exception.__init__


class NotPrivateError(RuntimeError):
    """Training would run without differential privacy (no clipping or noise): refused.

    Raised, for example, by a model that make_private prepared without DP settings
    and compiled with a plain Keras optimizer, or by a model loaded from a file saved
    by a private model before make_private is called on it again.
    """

    __init__ = Exception.__init__


class UnsupportedEinsumError(UnsupportedLayerError):
    """An EinsumDense equation (or layer) without row form: use the generic fallback."""


class ScalarLossError(ValueError):
    """A loss that reduces over the batch: it has no per-example value to clip."""

    __init__ = Exception.__init__


class NativeBuildError(RuntimeError):
    """The native op could not be compiled or loaded."""


class InsecureDPRandomnessWarning(UserWarning):
    """DP randomness from ``insecure_dp_seed``: reproducible, so the ε does not hold."""
