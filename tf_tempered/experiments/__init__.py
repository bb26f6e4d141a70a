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
"""absl scripts reproducing Papernot et al. (AAAI 2021), one module per script.

* ``python -m tf_tempered.experiments.train``: one (DP-)SGD run, ``metrics.json`` + ``model.keras``;
* ``python -m tf_tempered.experiments.sweep``: accuracy over (s, T, o) triplets (Figure 2);
* ``python -m tf_tempered.experiments.pareto``: accuracy vs ε for ReLU and tanh (Figure 3);
* ``python -m tf_tempered.experiments.activation_norms``: first-layer activation norms (Figure 4).

Each script's work is a plain function (``run_training``, ``run_sweep``, ``run_pareto``,
``run_activation_norms``) taking a :class:`TrainConfig`; the absl ``main`` only parses flags.
"""

from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config

__all__ = ["ConfigError", "TrainConfig", "validate_config"]
