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
"""Fewer glibc malloc arenas for the experiment scripts' processes.

glibc gives threads up to 8 × (CPU count) malloc arenas. TensorFlow's thread pools
allocate and free large buffers (MNIST's recipe: a 65 MB batch of features a step) from
many of them, and memory freed in one arena is not reused by another, so resident
memory grows epoch after epoch: 1.56 → 2.23 GiB over 10 epochs of the MNIST recipe on
this 2-vCPU machine, against a flat 1.89–1.95 GiB with ``MALLOC_ARENA_MAX=2``
(docs/reproduction.md, "What a run takes"). The scripts' entry points therefore cap the
arenas at the CPU count, as that variable would, unless the user set it.

>>> limit_malloc_arenas({"MALLOC_ARENA_MAX": "8"}) is None  # the user's setting stays
True
"""

import ctypes
import ctypes.util
import os

__all__ = ["ARENA_MAX_ENV", "limit_malloc_arenas"]

ARENA_MAX_ENV = "MALLOC_ARENA_MAX"
_M_ARENA_MAX = -8  # glibc's malloc.h


def limit_malloc_arenas(environ=None, cpu_count=None):
    """Caps glibc's malloc arenas at max(2, CPU count) for arenas made from now on.

    Returns the cap set, or None where nothing was changed: ``$MALLOC_ARENA_MAX`` set
    (glibc reads it itself), or no glibc (macOS, Windows, musl).
    """
    environ = os.environ if environ is None else environ
    if environ.get(ARENA_MAX_ENV):
        return None
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return None
    cap = max(2, cpu_count or os.cpu_count() or 2)
    return cap if mallopt(_M_ARENA_MAX, cap) == 1 else None


def _glibc_mallopt():
    """glibc's ``mallopt``, or None."""
    name = ctypes.util.find_library("c")
    if not name or not hasattr(os, "confstr"):
        return None
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # "glibc 2.35"; musl and others: none
            return None
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, ValueError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt
