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
"""Features of shifted and mirrored copies of the images (augmentation multiplicity).

:func:`shifted_scattering_features` caches the features of the images shifted by
every (dy, dx) within ±s pixels (zero fill), and with ``flip`` of those shifted
images mirrored left-right too, one float16 ``.npy`` file per variant, written chunk
by chunk; it returns a :class:`ShiftedFeatures`, which reads the rows a training batch
needs from those files (:class:`~tf_tempered.scatternet.cache.RowFile`) instead of
holding them in memory. A shift cannot be applied to the
features exactly (they are subsampled by 2^J = 4, and kymatio pads by reflection),
nor can a mirror (the oriented wavelets' channels and the subsampling grid would
move), so every variant is transformed from the shifted (mirrored) images themselves.
"""

import os
import pathlib
import tempfile
import threading

import numpy as np

from tf_tempered import augment
from tf_tempered._compat import tf
from tf_tempered.scatternet.cache import (RowFile, as_rows, default_cache_dir, digest,
                                          human_size, is_valid_npy, plain_path, shifted_path)
from tf_tempered.scatternet.features import scattering_features, show_progress
from tf_tempered.scatternet.transform import (CHUNK, Progress, as_nhwc, check_transform,
                                              kymatio_modules, num_channels, transform_chunks)

__all__ = ["ShiftedFeatures", "shifted_scattering_features"]


class ShiftedFeatures:
    """Scattering features of N images under V variants (shifts, mirrors), on disk:
    :func:`shifted_scattering_features`.

    Array-like, of shape [n, V, h, w, K] and dtype float16 (``x[i]``, ``x[a:b]``,
    ``x[:, v]`` and ``np.asarray(x)`` read the files), where row i is example
    ``rows[i]`` of the files: :meth:`without_rows` drops rows without reading anything
    (e.g. a validation block). Training reads only what a batch needs:
    :meth:`copies` is the ``copies`` argument of :func:`tf_tempered.augment.augmult_batches`
    for batches of file rows (``rows``; see tf_tempered/experiments/train_data.py).
    """

    def __init__(self, paths, shifts, rows, feature_shape, dtype=np.float16):
        # shifts[v]: variant v's (dy, dx, mirrored).
        self.paths, self.shifts = tuple(map(str, paths)), tuple(shifts)
        self.rows = np.asarray(rows, np.int64)
        self.feature_shape, self.dtype = tuple(feature_shape), np.dtype(dtype)
        self._files, self._lock = None, threading.Lock()

    @property
    def shape(self):
        return (len(self.rows), len(self.paths)) + self.feature_shape

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes of the files' rows (what loading them all would take)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __len__(self):
        return len(self.rows)

    def __repr__(self):
        return (f"ShiftedFeatures(shape={self.shape}, dtype={self.dtype.name}, shifts="
                f"{len(self.shifts)}, in {os.path.dirname(self.paths[0]) or '.'})")

    def without_rows(self, start, stop):
        """These features minus rows [start, stop) (tf_tempered.data.without_block)."""
        return ShiftedFeatures(self.paths, self.shifts,
                               np.concatenate([self.rows[:start], self.rows[stop:]]),
                               self.feature_shape, self.dtype)

    def _opened(self):
        with self._lock:
            if self._files is None:
                self._files = [RowFile(p) for p in self.paths]
            return self._files

    def read(self, rows, variants):
        """Features of file rows ``rows`` under shift number ``variants`` (arrays of one
        length M): [M, h, w, K] of this dtype; zeros where a row is negative (padding)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        variants = np.asarray(variants).reshape(-1)
        files = self._opened()
        out = np.zeros((len(rows),) + self.feature_shape, self.dtype)
        for v in np.unique(variants[rows >= 0]):
            where = np.flatnonzero((variants == v) & (rows >= 0))
            # The unshifted variant's float32 file is rounded to this dtype here.
            block = files[int(v)].take(rows[where]).astype(self.dtype, copy=False)
            as_rows(out)[where] = as_rows(block)
        return out

    def __getitem__(self, key):
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        rows = self.rows[first]
        scalar = np.ndim(rows) == 0
        rows = np.atleast_1d(rows)
        variants = len(self.paths)
        out = self.read(np.repeat(rows, variants), np.tile(np.arange(variants), len(rows)))
        out = out.reshape((len(rows), variants) + self.feature_shape)
        if scalar:
            return out[0][tuple(rest)]
        return out[(slice(None),) + tuple(rest)]

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)

    def copies(self, rows, multiplicity, seed):
        """``multiplicity`` copies of each of a batch's file ``rows``, each the features
        of a uniformly random shift: [B·K, h, w, K] float32, the copies of row i
        consecutive, drawn as :func:`tf_tempered.augment.pick_variants` draws them
        (same seed, same shifts); zeros for a negative row (a batch's padding)."""
        rows = tf.convert_to_tensor(rows, tf.int64)
        which = augment.draw_variants(tf.shape(rows)[0], multiplicity, len(self.paths), seed)
        features = tf.numpy_function(
            self.read, [tf.repeat(rows, multiplicity), tf.reshape(which, [-1])],
            tf.as_dtype(self.dtype))
        features = tf.ensure_shape(features, [None] + list(self.feature_shape))
        return tf.cast(features, tf.float32)


def shifted_scattering_features(images, *, max_shift, flip=False, J=2, L=8, cache_dir=None,
                                cache=True, dtype=np.float16, progress=None):
    """Scattering features of ``images`` under every integer shift within ±``max_shift`` pixels
    (and, with ``flip``, of each shifted image mirrored left-right).

    Variant v = a·(2s+1) + b (s = max_shift) holds the features of the images
    zero-padded by s and cropped back to H × W at offset (a, b), i.e. shifted by
    (s − a, s − b) as :func:`tf_tempered.augment.random_shift_flip` shifts them; with
    ``flip``, variant (2s+1)² + v holds those of variant v's images mirrored (shift
    first, then mirror, as random_shift_flip does). A uniformly random variant per
    augmented copy is thus exactly random_shift_flip's augmentation of the images (a
    uniform shift, mirrored with probability 1/2), with the transform computed once
    per variant instead of once per copy.

    Returns, with ``cache`` (the default), a :class:`ShiftedFeatures` of shape
    [N, V, H / 2^J, W / 2^J, K], V = (2s+1)² (twice that with ``flip``), that reads the
    cache files when asked (nothing is held in memory): one ``dtype`` file per variant
    other than the plain images, about
    N·K·(H/2^J)·(W/2^J)·2 bytes each for float16, computed chunk by chunk the first
    time; the unshifted variant is :func:`scattering_features`' float32 file, rounded
    to ``dtype`` when read. With ``cache=False``, the array itself (in memory).
    ``progress`` as in :func:`scattering_features`.

    >>> shifted_scattering_features(np.zeros((2, 8, 8)), max_shift=1, J=1, L=2,
    ...                             cache=False).shape
    (2, 9, 4, 4, 3)
    >>> shifted_scattering_features(np.zeros((2, 8, 8)), max_shift=0, flip=True, J=1, L=2,
    ...                             cache=False).shape
    (2, 2, 4, 4, 3)
    """
    x = as_nhwc(images)
    shifts = _variants(max_shift, flip)
    check_transform(J, L, x.shape[1:3])
    kymatio_modules()
    n, h, w, c = x.shape
    feature_shape = (h // 2 ** J, w // 2 ** J, c * num_channels(J, L))
    plain_variant = (0, 0, False)
    if cache:
        folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        plain = plain_path(folder, x, J, L, digest(x))
        paths = [plain if shift == plain_variant else shifted_path(plain, *shift, dtype)
                 for shift in shifts]
        if not is_valid_npy(plain, (n,) + feature_shape, np.float32):
            scattering_features(x, J=J, L=L, cache_dir=folder, progress=progress)
        todo = [i for i, (p, shift) in enumerate(zip(paths, shifts))
                if shift != plain_variant and not is_valid_npy(p, (n,) + feature_shape, dtype)]
    else:
        todo = [i for i, shift in enumerate(shifts)]
    show = show_progress(progress, n * c * (len(todo) or len(shifts)))  # all cached: says so
    label = (f"ScatterNet features (J={J}, L={L}) of {len(todo)} shifted "
             f"{'or mirrored ' if flip else ''}copies of {n} images")
    if show and todo and cache:
        print(f"{label}: not cached yet, writing {len(todo)} files of "
              f"{human_size(n * np.prod(feature_shape) * np.dtype(dtype).itemsize)} in {folder}",
              flush=True)
    elif show and cache:
        print(f"ScatterNet features of {len(shifts)} {'shifts and mirrors' if flip else 'shifts'}"
              f" of {n} images: cached in {folder} (read per batch)", flush=True)
    progress_bar = Progress(label, n * c * len(todo), show)
    if not cache:
        out = np.empty((n, len(shifts)) + feature_shape, dtype)
        for v, features in _shifted_chunks(x, [shifts[i] for i in todo], J, L, progress_bar):
            out[features[0]:features[0] + len(features[1]), v] = features[1]
        return out
    if todo:
        folder.mkdir(parents=True, exist_ok=True)
        _write_shifted(x, [shifts[i] for i in todo], [paths[i] for i in todo], J, L,
                       feature_shape, dtype, progress_bar)
    return ShiftedFeatures(paths, shifts, np.arange(n), feature_shape, dtype)


def _variants(max_shift, flip):
    """[(dy, dx, mirrored)] of shifted_scattering_features, in its variant order."""
    if isinstance(max_shift, bool) or not isinstance(max_shift, (int, np.integer)) \
            or max_shift < 0:
        raise ValueError(f"max_shift={max_shift!r} is invalid: it must be an integer >= 0 "
                         "(pixels).")
    if not isinstance(flip, (bool, np.bool_)):
        raise ValueError(f"flip={flip!r} is invalid: it must be True or False.")
    s = int(max_shift)
    return [(s - a, s - b, mirrored) for mirrored in ((False, True) if flip else (False,))
            for a in range(2 * s + 1) for b in range(2 * s + 1)]


def _shifted_chunks(x, shifts, J, L, progress):
    """Yields (variant index, (start, features)) for every chunk of x under every
    (dy, dx, mirrored) variant: shifted, then mirrored left-right if ``mirrored``."""
    n, h, w, c = x.shape
    s = max([max(abs(dy), abs(dx)) for dy, dx, _ in shifts] + [0])
    size = max(1, CHUNK // c)

    def tasks():
        for start in range(0, n, size):
            padded = np.pad(x[start:start + size], [(0, 0), (s, s), (s, s), (0, 0)])
            for dy, dx, mirrored in shifts:
                crop = padded[:, s - dy:s - dy + h, s - dx:s - dx + w]
                if mirrored:
                    crop = crop[:, :, ::-1]
                yield np.ascontiguousarray(np.moveaxis(crop, -1, 1)).reshape(-1, h, w)

    keys = ((v, start) for start in range(0, n, size) for v in range(len(shifts)))
    for (v, start), out in zip(keys, transform_chunks(tasks(), J, L, (h, w), progress)):
        rows = out.shape[0] // c
        yield v, (start, np.moveaxis(out.reshape(rows, -1, *out.shape[-2:]), 1, -1))


def _write_shifted(x, shifts, paths, J, L, feature_shape, dtype, progress):
    """Computes the features of every shift, chunk by chunk, into one file per shift."""
    n = len(x)
    files = []
    try:
        for path in paths:
            f = tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy.tmp", delete=False)
            files.append(f)
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                    "fortran_order": False, "shape": (n,) + tuple(feature_shape)})
        for v, (_, features) in _shifted_chunks(x, shifts, J, L, progress):
            files[v].write(np.ascontiguousarray(features, dtype).tobytes())
        for f, path in zip(files, paths):
            f.close()
            os.chmod(f.name, 0o644)  # a shared cache: NamedTemporaryFile makes it owner-only
            os.replace(f.name, path)
    except BaseException:
        for f in files:
            f.close()
            if os.path.exists(f.name):
                os.unlink(f.name)
        raise
