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
"""README.md's Quickstart runs verbatim, offline, and prints test accuracy and ε."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

from tf_tempered._compat import KERAS_MAJOR

REPO = pathlib.Path(__file__).resolve().parents[1]


def quickstart_block():
    """The first ```python block after README.md's heading that names the Quickstart."""
    readme = (REPO / "README.md").read_text()
    heading = re.search(r"^#+ .*Quickstart.*$", readme, re.MULTILINE)
    assert heading, "README.md must have a Quickstart heading"
    block = re.search(r"```python\n(.*?)```", readme[heading.end():], re.DOTALL)
    assert block, "README.md's Quickstart must hold a ```python block"
    return block.group(1)


# It imports `keras` (Keras 3), as the README shows: run once, in the Keras 3 suite.
@pytest.mark.skipif(KERAS_MAJOR != 3, reason="the Quickstart is written for Keras 3")
def test_quickstart_runs_verbatim_offline(tmp_path):
    script = tmp_path / "quickstart.py"
    script.write_text(quickstart_block())
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    # No network: TFDS and Keras' downloads would fail (the block must not need them).
    env.update(NO_PROXY="*", no_proxy="*", HTTPS_PROXY="http://127.0.0.1:9",
               HTTP_PROXY="http://127.0.0.1:9")
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                            env=env, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    found = re.search(r"test accuracy ([0-9.]+), ε = ([0-9.]+) at δ = 1e-05", result.stdout)
    assert found, result.stdout[-2000:]
    accuracy, epsilon = float(found.group(1)), float(found.group(2))
    assert accuracy > 0.5  # 10 classes; ≈ 0.93 measured
    assert 1.0 < epsilon < 20.0  # 20 epochs of q = 64/1438 at σ = 1.1: ≈ 5.7
