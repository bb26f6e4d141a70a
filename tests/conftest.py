# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Shared test setup: bind Keras 2 before any test module touches TensorFlow."""

import os
import pathlib

import pytest

import tf_tempered  # noqa: F401  (the compat bootstrap must run first)

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


@pytest.fixture
def shared_data_dir():
    """../shared/data beside the checkout (full MNIST and Fashion-MNIST IDX files)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} not present")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _clear_keras_session():
    from tf_tempered._compat import keras
    keras.backend.clear_session()
    yield
