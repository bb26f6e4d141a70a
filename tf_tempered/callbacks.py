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
"""Keras callbacks of tf_tempered (the public namespace; each lives in its own module).

* :class:`PrivacyBudget` (:mod:`tf_tempered.privacy_budget`): ε in the logs, stops before
  a target ε, counts DP steps across killed and resumed runs;
* :class:`ActivationNormMonitor` (:mod:`tf_tempered.activation_monitor`): the mean
  per-example norm of a layer's outputs each epoch, and its plot.
"""

from tf_tempered.activation_monitor import ActivationNormMonitor, plot_activation_norms
from tf_tempered.privacy_budget import PrivacyBudget, dp_optimizer_settings

__all__ = ["PrivacyBudget", "ActivationNormMonitor", "plot_activation_norms",
           "dp_optimizer_settings"]
