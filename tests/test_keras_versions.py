# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""One engine, two Kerases: the Keras 3 and Keras 2 DP updates agree, and both equal TF Privacy's.

Each Keras runs in its own fresh process (a process binds one Keras), on the same
initial weights and batch (tests/one_dp_step.py), with noise 0 and a clip norm
that clips. TF Privacy's DPKerasSGDOptimizer joins where it installs (Keras 2,
Python <= 3.11). Every registered handler is held to per-example tapes on both
Kerases by tests/test_conformance_*.py (CI runs them on each).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from once_per_session import once_per_session

from tf_tempered._compat import tensorflow_privacy

# Also run on Python 3.11 with Keras 3 and TF Privacy installed (see conftest, .ci/run).
# The Keras bound in this process does not matter (each Keras runs in its own process):
# the Keras 2 suite leaves it to the keras_matrix run of the same Python (keras3_suite),
# which computes the same three updates.
pytestmark = [pytest.mark.keras_matrix, pytest.mark.keras3_suite]

HERE = pathlib.Path(__file__).resolve().parent
INPUT_SHAPES = {"mnist_cnn": (28, 28, 1), "cifar10_cnn": (32, 32, 3),
                "learnable_tempered": (10, 10, 1)}


def _tf_privacy_installed():
    import importlib.util  # pylint: disable=g-import-not-at-top
    return importlib.util.find_spec("tensorflow_privacy") is not None


def _run(work_dir, keras_major, path):
    """Runs one_dp_step.py for every model in a fresh process of that Keras; the updates."""
    env = {k: v for k, v in os.environ.items() if k != "TF_USE_LEGACY_KERAS"}
    if keras_major == 2:
        env["TF_USE_LEGACY_KERAS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent)] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    result = subprocess.run([sys.executable, str(HERE / "one_dp_step.py"), str(work_dir), path]
                            + sorted(INPUT_SHAPES), capture_output=True, text=True, env=env,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    updates = {}
    for model_name in INPUT_SHAPES:
        update = np.load(work_dir / model_name / f"update-{keras_major}-{path}.npz")
        updates[model_name] = [update[f"w{i}"] for i in range(len(update.files))]
    return updates


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """{(keras major, path): {model: update}} for one batch per model, same initial weights."""
    return once_per_session(tmp_path_factory, "keras_versions_updates",
                            lambda: _updates(tmp_path_factory))


def _updates(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("keras_versions")
    rng = np.random.default_rng(1)
    for model_name, shape in INPUT_SHAPES.items():
        (work_dir / model_name).mkdir()
        np.savez(work_dir / model_name / "batch.npz",
                 x=rng.uniform(size=(8,) + shape).astype("float32"), y=rng.integers(0, 10, 8))
    runs = {(3, "engine"): _run(work_dir, 3, "engine")}  # writes the initial weights
    runs[(2, "engine")] = _run(work_dir, 2, "engine")
    if _tf_privacy_installed():
        runs[(2, "tf_privacy")] = _run(work_dir, 2, "tf_privacy")
    return runs


@pytest.mark.parametrize("model_name", sorted(INPUT_SHAPES))
def test_keras3_update_equals_keras2_update_and_tf_privacy(model_name, updates):
    keras3, keras2 = updates[(3, "engine")][model_name], updates[(2, "engine")][model_name]
    scale = max(np.abs(u).max() for u in keras3)
    assert scale > 0 and len(keras3) == len(keras2)
    for u3, u2 in zip(keras3, keras2):
        assert u3.shape == u2.shape
        np.testing.assert_allclose(u3, u2, rtol=0, atol=1e-5 * scale)
    if not _tf_privacy_installed():  # Python 3.12+: Keras 3 == Keras 2 is what can be checked
        assert tensorflow_privacy is None
        return
    for u3, r in zip(keras3, updates[(2, "tf_privacy")][model_name]):
        np.testing.assert_allclose(u3, r, rtol=0, atol=1e-5 * scale)
