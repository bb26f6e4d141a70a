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
images), and of each shifted or mirrored copy, float16 or 8-bit codes (``log8``, every
variant: :mod:`~tf_tempered.scatternet.codes`). Files can be deleted at any time; they
are recomputed when needed.
"""

import hashlib
import os
import pathlib
import threading
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
    return folder / (f"scat_J{J}_L{L}_kymatio{version}_" + "x".join(map(str, x.shape))
                     + f"_{digest}.npy")


def human_size(nbytes):
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


class RowFile:
    """Rows of one ``.npy`` file, read with positioned reads into the result.

    ``take(rows)`` reads each run of consecutive rows with one ``os.preadv`` (scattered
    into the result's rows, at most ``IOV_MAX`` rows a call): the file's pages stay in
    the OS's page cache, shared and reclaimable, and never count in this process's
    resident memory, however much of the file the epochs read. (A memory map would
    count every page read until unmapped; releasing them after each read made each batch
    fault them in again: 25-29 ms for 2,048 random rows of 15.9 KB against 14 ms read
    this way, measured on this machine, the pages in the OS's cache.)
    """

    def __init__(self, path):
        with open(path, "rb") as f:
            version = np.lib.format.read_magic(f)
            read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            self.shape, fortran, self.dtype = read_header(f)
            self._offset = f.tell()
        if fortran:
            raise ValueError(f"{path}: a Fortran-ordered array; delete the file.")
        self.path = str(path)
        self._row_bytes = self.dtype.itemsize * int(np.prod(self.shape[1:]))
        self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))

    def __del__(self):
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is not None:
            os.close(fd)

    def take(self, rows):
        """Rows ``rows`` (any order, repeats allowed; each in [0, N)) as [len(rows), ...]."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= self.shape[0]):
            raise IndexError(f"rows out of [0, {self.shape[0]}) in {self.path}")
        out = np.empty((len(rows),) + tuple(self.shape[1:]), self.dtype)
        if not rows.size or not self._row_bytes:
            return out
        order = np.argsort(rows, kind="stable")  # in file order
        ordered = rows[order]
        starts = np.flatnonzero(np.diff(ordered, prepend=-2) != 1)  # runs of consecutive rows
        ends = np.append(starts[1:], len(rows))
        views = out.reshape(len(rows), -1).view(np.uint8)  # [len(rows), row bytes]
        for start, end in zip(starts.tolist(), ends.tolist()):
            for first in range(start, end, _MAX_BUFFERS):
                last = min(end, first + _MAX_BUFFERS)
                _read_at(self._fd, [views[i] for i in order[first:last].tolist()],
                         self._offset + int(ordered[first]) * self._row_bytes, self.path)
        return out


def _max_buffers():
    try:
        return max(1, min(1024, os.sysconf("SC_IOV_MAX")))
    except (AttributeError, ValueError, OSError):  # no sysconf, or no such limit named
        return 1024


_MAX_BUFFERS = _max_buffers()  # buffers per os.preadv call


def _read_at(fd, buffers, offset, path):
    """Fills ``buffers`` in turn from ``fd`` at ``offset``: os.preadv, else os.pread per
    buffer, else (Windows) a seek and a read under a lock."""
    want = sum(len(b) for b in buffers)
    if hasattr(os, "preadv"):
        done = os.preadv(fd, buffers, offset)
    else:
        done = 0
        for buffer in buffers:
            chunk = _pread(fd, len(buffer), offset + done)
            buffer[:len(chunk)] = np.frombuffer(chunk, np.uint8)
            done += len(chunk)
    if done != want:
        raise OSError(f"{path}: read {done} of {want} bytes at offset {offset}; the file is "
                      "truncated: delete it (it is recomputed when needed).")


_seek_lock = threading.Lock()


def _pread(fd, size, offset):
    if hasattr(os, "pread"):
        return os.pread(fd, size, offset)
    with _seek_lock:  # the file position is shared by every thread
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)


def as_rows(array):
    """A C-contiguous array [N, ...] as N opaque rows (fancy indexing then copies whole
    rows, several times faster than element by element)."""
    row = array.dtype.itemsize * int(np.prod(array.shape[1:]))
    return array.reshape(len(array), -1).view(np.dtype((np.void, row)))[:, 0]


def shifted_path(plain, dy, dx, mirrored, storage):
    """The file of one shifted (mirrored) variant stored as ``storage`` (float16, log8)."""
    mirror = "_mirror" if mirrored else ""
    return plain.with_name(f"{plain.stem}{mirror}_shift{dy:+d}{dx:+d}_{storage}.npy")


def is_valid_npy(path, shape, dtype):
    """Whether ``path`` is a .npy file of this shape and dtype (header only)."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    ok = array.shape == tuple(shape) and array.dtype == np.dtype(dtype)
    del array
    return ok
