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
"""Empirical privacy audit of a non-private and a DP-SGD CNN on an MNIST subset.

Usage: python -m tf_tempered.audit [--num_train=1000] [--epochs=40]
    [--noise_multiplier=1.1] [--num_shadow=0] [--data_dir=DIR] [--output_dir=DIR]
    [--model_path=DIR] ...  (see tf_tempered.audit.cli)
       python -m tf_tempered.audit one-run [--dataset=digits] [--epochs=10]
    [--noise_multiplier=1.0] [--num_canaries=1000] [--output_dir=DIR] ...
    (one-run white-box and black-box audits; see tf_tempered.audit.one_run_cli)
"""

from tf_tempered.audit.cli import run

if __name__ == "__main__":
    run()
