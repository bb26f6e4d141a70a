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
"""What the benchmarks that run the train script in fresh processes share: their common
flags (--timeout, --json, --render), the machine's description and load, and writing a
result as JSON and as its markdown table (end_to_end.py, train_step_times.py)."""

import json
import os
import platform


def add_output_arguments(parser):
    """--timeout, --json and --render, as every such script takes them."""
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--render", metavar="JSON", help="only print the table of a --json file")


def render_file(path, render):
    """Prints ``render`` of the result stored at ``path`` (--render)."""
    with open(path) as f:
        print(render(json.load(f)))


def load_average():
    """The 1-, 5- and 15-minute load averages, as "a/b/c"."""
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def finish(result, *, load_before, json_path, render):
    """Adds the load after and the environment to ``result``, writes it (``json_path``) and
    prints its table."""
    result.update(load_before=load_before, load_after=load_average(),
                  environment=f"Python {platform.python_version()}, {platform.machine()}, "
                              f"{os.cpu_count()} CPUs, TF_USE_LEGACY_KERAS="
                              f"{os.environ.get('TF_USE_LEGACY_KERAS', 'unset')}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    print(render(result))
