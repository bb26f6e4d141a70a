# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Shared test setup (the Keras is the one TensorFlow binds: 3, or 2 with TF_USE_LEGACY_KERAS=1)."""

import os
import pathlib

import pytest

import tf_tempered  # noqa: F401

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

TF_PRIVACY_SKIP_REASON = (
    "TensorFlow Privacy is not installed (setup.cfg installs it on Python <= 3.11 only); "
    "this test compares with it")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "tf_privacy: compares with TensorFlow Privacy; skipped where it is not "
        "installed (Python 3.12+)")
    config.addinivalue_line(
        "markers", "keras_matrix: depends on which Keras is bound and whether TF Privacy is "
        "installed, beyond the engine itself (imports, version selection, Keras 2 vs 3 vs TF "
        "Privacy); CI runs these also on Python 3.11 with Keras 3 and TF Privacy installed "
        "(`-m keras_matrix`), where the rest of the suite repeats the Python 3.12 Keras 3 run")


def pytest_collection_modifyitems(config, items):
    from tf_tempered._compat import tensorflow_privacy
    if tensorflow_privacy is not None:
        return
    skip = pytest.mark.skip(reason=TF_PRIVACY_SKIP_REASON)
    for item in items:
        if item.get_closest_marker("tf_privacy") is not None:
            item.add_marker(skip)


@pytest.fixture
def shared_data_dir():
    """../shared/data beside the checkout (full MNIST and Fashion-MNIST IDX files)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _clear_keras_session():
    from tf_tempered._compat import KERAS_MAJOR, keras
    # Keras 3's clear_session also runs a full garbage collection by default, which
    # costs seconds per test late in a long run; the session state is what matters.
    keras.backend.clear_session(**({"free_memory": False} if KERAS_MAJOR == 3 else {}))
    yield
