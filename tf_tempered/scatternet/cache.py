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
"""Where the features live on disk: the cache folder, file names, and row reads.

Cache (``$TF_TEMPERED_CACHE_DIR/scatternet``, default ``~/.cache/tf_tempered/scatternet``;
its size for ``--recipe=best``: docs/reproduction.md, "What a run takes"): the features
of each image array, float32, named by the transform (J, L, kymatio version), the
array's shape and the SHA-256 of its bytes (so a cached file is never used for other
images), and of each shifted or mirrored copy, float16. Files can be deleted at any
time; they are recomputed when needed.
"""

import hashlib
import mmap
import os
import pathlib
import warnings

import numpy as np

from tf_tempered.scatternet.transform import kymatio_modules

__all__ = ["CACHE_DIR_ENV", "default_cache_dir", "digest", "plain_path", "shifted_path",
           "is_valid_npy", "human_size", "RowFile", "as_rows"]

CACHE_DIR_ENV = "TF_TEMPERED_CACHE_DIR"  # shared with tf_tempered.privacy.native
_OLD_CACHE_ENV = "TF_TEMPERED_CACHE"  # read before; deprecated


def default_cache_dir():
    """``$TF_TEMPERED_CACHE_DIR/scatternet``, else ``~/.cache/tf_tempered/scatternet``.

    (``$TF_TEMPERED_CACHE``, read before, still works, with a FutureWarning.)
    """
    root = os.environ.get(CACHE_DIR_ENV)
    if not root and os.environ.get(_OLD_CACHE_ENV):
        warnings.warn(f"${_OLD_CACHE_ENV} is deprecated and will be ignored in a future "
                      f"release: set ${CACHE_DIR_ENV} instead (the ScatterNet features go "
                      f"in its scatternet/ folder).", FutureWarning, stacklevel=2)
        root = os.environ[_OLD_CACHE_ENV]
    root = pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "tf_tempered"
    return root.expanduser() / "scatternet"


def digest(x):
    return hashlib.sha256(x.tobytes()).hexdigest()[:20]


def plain_path(folder, x, J, L, digest):
    _, _, version = kymatio_modules()
    return folder / (f"scat_J{J}_L{L}kymatio_modules{version}_" + "x".join(map(str, x.shape))
                     + f"_{digest}.npy")


def human_size(nbytes):
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


class RowFile:
    """Rows of one ``.npy`` file, read through a read-only memory map.

    After each read the map's pages are released (``MADV_DONTNEED``): they stay in
    the OS's page cache, but stop counting in this process's resident memory, which
    would otherwise grow to the size of every file read.
    """

    def __init__(self, path):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            self.shape, fortran, self.dtype = read_header(f)
            offset = f.tell()
            if fortran:
                raise ValueError(f"{path}: a Fortran-ordered array; delete the file.")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_RANDOM"):
            self._map.madvise(mmap.MADV_RANDOM)  # no read-ahead into this process
        self.array = np.frombuffer(self._map, self.dtype, count=int(np.prod(self.shape)),
                                   offset=offset).reshape(self.shape)
        self._rows = as_rows(self.array)

    def take(self, rows):
        order = np.argsort(rows, kind="stable")  # in file order
        out = np.empty((len(rows),) + self.shape[1:], self.dtype)
        as_rows(out)[order] = self._rows[rows[order]]
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)
        return out


def as_rows(array):
    """A C-contiguous array [N, ...] as N opaque rows (fancy indexing then copies whole
    rows, several times faster than element by element)."""
    row = array.dtype.itemsize * int(np.prod(array.shape[1:]))
    return array.reshape(len(array), -1).view(np.dtype((np.void, row)))[:, 0]


def shifted_path(plain, dy, dx, mirrored, dtype):
    mirror = "_mirror" if mirrored else ""
    return plain.with_name(f"{plain.stem}{mirror}_shift{dy:+d}{dx:+d}_{np.dtype(dtype).name}.npy")


def is_valid_npy(path, shape, dtype):
    """Whether ``path`` is a .npy file of this shape and dtype (header only)."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    ok = array.shape == tuple(shape) and array.dtype == np.dtype(dtype)
    del array
    return ok
