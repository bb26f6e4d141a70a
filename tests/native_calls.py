# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Which native ops a test's step took: ``tf_tempered.privacy.native.<name>`` wrapped to record
each call (while tracing: once per traced function, not per step).

    calls = record_calls(monkeypatch, "row_sq_norms")
    ...                                   # build and train the model
    assert calls                          # the op was taken

``record(args, kwargs)`` is what each call appends (default 1), e.g. an argument's value.
"""

from tf_tempered.privacy import native


def record_calls(monkeypatch, name, record=lambda args, kwargs: 1, calls=None):
    """The list (``calls`` if given) that each call of native.<name> appends record(...) to."""
    calls = [] if calls is None else calls
    real = getattr(native, name)

    def recorded(*args, **kwargs):
        calls.append(record(args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(native, name, recorded)
    return calls
