# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""examples/: each script runs as a user would run it and prints what it promises."""

import os
import pathlib
import re
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_digits_dp_prints_accuracy_and_epsilon():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    result = subprocess.run([sys.executable, str(REPO / "examples" / "digits_dp.py"),
                             "--epochs", "1"], capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    accuracy = float(re.search(r"test accuracy: ([0-9.]+)", result.stdout).group(1))
    assert 0.1 < accuracy <= 1.0  # 10 classes: better than chance after one DP epoch
    assert re.search(r"epsilon: [0-9.]+ at delta=1e-05", result.stdout)
    assert re.search(r"clipped fraction \(last epoch\): [0-9.]+", result.stdout)
