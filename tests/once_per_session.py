# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""A module fixture's value computed once per test session, across pytest-xdist workers.

pytest-xdist hands a module's tests to both workers, and each worker then runs the module's
fixtures itself: a fixture that trains in subprocesses for 40 s ran twice in the Keras 3
suite (both copies on the same two cores). `once_per_session` runs it in the first worker
that asks, under a file lock in the directory the workers share, and the other worker reads
the pickled value.

    @pytest.fixture(scope="module")
    def runs(tmp_path_factory):
        return once_per_session(tmp_path_factory, "runs", lambda: _train_in_subprocesses())

The value must pickle. A compute that raises writes nothing: the next worker to ask runs it
again (and fails the same way), so a failure is reported where it is met.
"""

import os
import pickle

try:
    import fcntl
except ImportError:  # Windows: no flock; each worker computes its own value, as without xdist
    fcntl = None

__all__ = ["once_per_session"]


def once_per_session(tmp_path_factory, key, compute):
    """compute()'s value, computed by one xdist worker and read by the others (see above)."""
    if fcntl is None or "PYTEST_XDIST_WORKER" not in os.environ:
        return compute()
    shared = tmp_path_factory.getbasetemp().parent  # the same directory for every worker
    value_path = shared / f"once_{key}.pickle"
    with open(shared / f"once_{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if value_path.exists():
            return pickle.loads(value_path.read_bytes())
        value = compute()
        value_path.write_bytes(pickle.dumps(value))
        return value
