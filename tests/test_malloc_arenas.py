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
"""The experiment scripts' cap on glibc malloc arenas (tf_tempered/experiments/malloc_arenas.py)."""

import os
import sys

import pytest

from tf_tempered.experiments import command_line, malloc_arenas

# Keras-independent code: runs in the Keras 3 suite (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def _spy(monkeypatch, returns=1):
    calls = []
    monkeypatch.setattr(malloc_arenas, "_glibc_mallopt",
                        lambda: lambda option, value: calls.append((option, value)) or returns)
    return calls


@pytest.mark.parametrize("cpus, cap", [(1, 2), (2, 2), (16, 16)])
def test_caps_the_arenas_at_the_cpu_count(monkeypatch, cpus, cap):
    calls = _spy(monkeypatch)
    assert malloc_arenas.limit_malloc_arenas({}, cpu_count=cpus) == cap
    assert calls == [(-8, cap)]  # M_ARENA_MAX


def test_leaves_the_users_setting_and_reports_what_failed(monkeypatch):
    calls = _spy(monkeypatch)
    assert malloc_arenas.limit_malloc_arenas({"MALLOC_ARENA_MAX": "4"}) is None
    assert calls == []  # glibc reads the variable itself
    _spy(monkeypatch, returns=0)
    assert malloc_arenas.limit_malloc_arenas({}) is None
    monkeypatch.setattr(malloc_arenas, "_glibc_mallopt", lambda: None)  # macOS, musl
    assert malloc_arenas.limit_malloc_arenas({}) is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_glibc_accepts_the_cap():
    if malloc_arenas._glibc_mallopt() is None:
        pytest.skip("not glibc")
    assert malloc_arenas.limit_malloc_arenas({}) == max(2, os.cpu_count())


def test_every_script_entry_point_caps_the_arenas_first(monkeypatch):
    events = []
    monkeypatch.setattr(malloc_arenas, "limit_malloc_arenas",
                        lambda: events.append("limit"))
    main, cli = command_line.absl_entry_point(lambda: events.append("define flags"),
                                              lambda flags: events.append("run"))
    monkeypatch.setattr(sys, "argv", ["script"])
    with pytest.raises(SystemExit) as exit_info:
        cli()
    assert exit_info.value.code in (None, 0)
    assert events == ["limit", "define flags", "run"]
