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
"""benchmarks/dp_step.py (the README's speed table) still runs and reports every path."""

import json
import pathlib
import subprocess
import sys

from tf_tempered._compat import tensorflow_privacy

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The last two are TF Privacy's own paths: only where it is installed (Python <= 3.11).
PATHS = ("nonprivate", "tf_tempered", "tf_tempered_tf_ops") + (
    ("dpsequential", "stock_optimizer") if tensorflow_privacy is not None else ())


def test_dp_step_benchmark_runs_all_paths(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dp_step.py"), "--batch_size=8", "--steps=1",
         "--rounds=1", "--paths=" + ",".join(PATHS),
         f"--json={out}"], check=True, capture_output=True, timeout=600)
    rows = {row["path"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == set(PATHS)
    assert rows["nonprivate"]["time_ratio"] == 1.0
    for row in rows.values():
        assert row["ms_per_step"] > 0 and row["cpu_ms_per_step"] > 0 and row["peak_bytes"] > 0
