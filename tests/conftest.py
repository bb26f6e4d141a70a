# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Shared test setup (the Keras is the one TensorFlow binds: 3, or 2 with TF_USE_LEGACY_KERAS=1).

The default run (README's command, what CI runs) takes a covering subset of the large test
matrices: a test marked ``cover_each(*groups)`` runs, among its parametrizations, those
that bring a value not yet seen for one of the groups (a parameter name, or a tuple of
names whose values are taken together), in collection order; the others are marked
``extended`` and skipped unless ``--extended`` (or ``TF_TEMPERED_EXTENDED_TESTS=1``) asks
for the whole matrix (about an hour on 2 cores; docs/install.md).

Tests marked ``keras3_suite`` run in the Keras 3 suite, and in the Keras 2 one only with
``--extended`` (the comparisons with TF Privacy among them run on Keras 2 always): modules
whose code does not depend on the Keras version (accounting, samplers, data, the scripts'
command lines, the NumPy audit estimators), the examples (written for Keras 3), and the
per-path reference tests, which on Keras 2 the conformance cases and the comparisons with
TF Privacy stand in for.
"""

import os
import pathlib

import pytest

import tf_tempered  # noqa: F401

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"

TF_PRIVACY_SKIP_REASON = (
    "TensorFlow Privacy is not installed (setup.cfg installs it on Python <= 3.11 only); "
    "this test compares with it")


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true", default=False,
                     help="run the whole test matrices (tests marked extended), not only "
                          "their covering subset")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "cover_each(*groups): run only the parametrizations that cover each value "
        "of each group of parameters once (the rest are extended)")
    config.addinivalue_line(
        "markers", "extended: part of a full test matrix; runs with --extended")
    config.addinivalue_line(
        "markers", "keras3_suite: runs on Keras 3, and on Keras 2 with --extended (code that "
        "does not depend on the Keras version, or what other tests cover on Keras 2)")
    config.addinivalue_line(
        "markers", "tf_privacy: compares with TensorFlow Privacy; skipped where it is not "
        "installed (Python 3.12+)")
    config.addinivalue_line(
        "markers", "keras_matrix: depends on which Keras is bound and whether TF Privacy is "
        "installed, beyond the engine itself (imports, version selection, Keras 2 vs 3 vs TF "
        "Privacy); CI runs these also on Python 3.11 with Keras 3 and TF Privacy installed "
        "(`-m keras_matrix`), where the rest of the suite repeats the Python 3.12 Keras 3 run")


def _mark_beyond_cover(items):
    """Marks `extended` the parametrizations of cover_each tests that cover nothing new."""
    covered = {}  # test function -> {(group, values)}
    for item in items:
        marker = item.get_closest_marker("cover_each")
        params = getattr(getattr(item, "callspec", None), "params", None)
        if marker is None or not params:
            continue
        groups = marker.args or tuple(sorted(params))
        keys = {(group, tuple(repr(params[name]) for name in
                              ((group,) if isinstance(group, str) else group)))
                for group in groups}
        seen = covered.setdefault(item.originalname, set())
        if keys <= seen:
            item.add_marker(pytest.mark.extended)
        seen.update(keys)


def extended_run(config):
    """Whether the whole matrices run (--extended or TF_TEMPERED_EXTENDED_TESTS=1)."""
    return bool(config.getoption("--extended") or os.environ.get("TF_TEMPERED_EXTENDED_TESTS"))


def pytest_collection_modifyitems(config, items):
    from tf_tempered._compat import KERAS_MAJOR, tensorflow_privacy
    _mark_beyond_cover(items)
    if not extended_run(config):
        skip_extended = pytest.mark.skip(reason="extended test matrix: run with --extended")
        skip_on_keras2 = pytest.mark.skip(reason="runs in the Keras 3 suite (here with "
                                                 "--extended)")
        for item in items:
            if item.get_closest_marker("extended") is not None:
                item.add_marker(skip_extended)
            elif (KERAS_MAJOR == 2 and item.get_closest_marker("keras3_suite") is not None
                  and item.get_closest_marker("tf_privacy") is None):
                item.add_marker(skip_on_keras2)
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
