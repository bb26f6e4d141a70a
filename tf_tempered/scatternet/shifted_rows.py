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
"""The cached features of shifted copies, read per batch: :class:`ShiftedFeatures` (every
variant) and :class:`VariantRows` (one variant, e.g. the unshifted images)."""

import os
import threading

import numpy as np

from tf_tempered import augment
from tf_tempered._compat import tf
from tf_tempered.scatternet import codes
from tf_tempered.scatternet.cache import RowFile, as_rows

__all__ = ["ShiftedFeatures", "VariantRows"]


class ShiftedFeatures:
    """Scattering features of N images under V variants (shifts, mirrors), on disk:
    :func:`~tf_tempered.scatternet.shifted_scattering_features`.

    Array-like, of shape [n, V, h, w, K] (``x[i]``, ``x[a:b]``, ``x[:, v]`` and
    ``np.asarray(x)`` read the files), where row i is example ``rows[i]`` of the files:
    :meth:`without_rows` drops rows without reading anything (e.g. a validation block).
    ``storage``: "float16" (dtype float16; the unshifted variant is the float32 file of
    :func:`~tf_tempered.scatternet.scattering_features`, rounded when read) or "log8"
    (every variant in :mod:`~tf_tempered.scatternet.codes`' bytes, read as float32).
    Training reads only what a batch needs: :meth:`copies` is the ``copies`` argument of
    :func:`tf_tempered.augment.augmult_batches` for batches of file rows (``rows``; see
    tf_tempered/experiments/train_data.py).
    """

    def __init__(self, paths, shifts, rows, feature_shape, storage="float16"):
        # shifts[v]: variant v's (dy, dx, mirrored).
        self.paths, self.shifts = tuple(map(str, paths)), tuple(shifts)
        self.rows = np.asarray(rows, np.int64)
        self.feature_shape, self.storage = tuple(feature_shape), storage
        self._stored, self.dtype = codes.STORED_DTYPES[storage], codes.READ_DTYPES[storage]
        self._files, self._lock = None, threading.Lock()

    @property
    def shape(self):
        return (len(self.rows), len(self.paths)) + self.feature_shape

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def nbytes(self):
        """Bytes of the rows as read (what loading them all would take)."""
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __len__(self):
        return len(self.rows)

    def __repr__(self):
        return (f"ShiftedFeatures(shape={self.shape}, dtype={self.dtype.name}, storage="
                f"{self.storage}, shifts={len(self.shifts)}, in "
                f"{os.path.dirname(self.paths[0]) or '.'})")

    def without_rows(self, start, stop):
        """These features minus rows [start, stop) (tf_tempered.data.without_block)."""
        return ShiftedFeatures(self.paths, self.shifts,
                               np.concatenate([self.rows[:start], self.rows[stop:]]),
                               self.feature_shape, self.storage)

    def variant(self, shift):
        """The rows of one variant, (dy, dx, mirrored), as a :class:`VariantRows`."""
        return VariantRows(self, self.shifts.index(tuple(shift)))

    def _opened(self):
        with self._lock:
            if self._files is None:
                self._files = [RowFile(p) for p in self.paths]
            return self._files

    def read_stored(self, rows, variants):
        """Stored rows (float16, or log8's bytes) of file rows ``rows`` under variant
        number ``variants`` (arrays of one length M): [M, h, w, K]; zeros where a row is
        negative (padding; code 0 reads as 0 too)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        variants = np.asarray(variants).reshape(-1)
        files = self._opened()
        out = np.zeros((len(rows),) + self.feature_shape, self._stored)
        for v in np.unique(variants[rows >= 0]):
            where = np.flatnonzero((variants == v) & (rows >= 0))
            # float16: the unshifted variant's float32 file is rounded to float16 here.
            block = files[int(v)].take(rows[where]).astype(self._stored, copy=False)
            as_rows(out)[where] = as_rows(block)
        return out

    def read(self, rows, variants):
        """:meth:`read_stored`, as this object's dtype."""
        stored = self.read_stored(rows, variants)
        return codes.decode(stored) if self.storage == "log8" else stored

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
        stored = tf.numpy_function(
            self.read_stored, [tf.repeat(rows, multiplicity), tf.reshape(which, [-1])],
            tf.as_dtype(self._stored))
        stored = tf.ensure_shape(stored, [None] + list(self.feature_shape))
        if self.storage == "log8":
            return codes.decode_tensor(stored)
        return tf.cast(stored, tf.float32)


class VariantRows:
    """One variant of a :class:`ShiftedFeatures`, e.g. the unshifted images' features:
    array-like [n, h, w, K] float32 whose rows are read when indexed (``x[i]``,
    ``x[a:b]``, ``x[indices]``, ``np.asarray(x)``), what training's statistics and
    validation split read instead of a float32 file (log8 storage)."""

    def __init__(self, features, variant):
        self.features, self.variant = features, int(variant)
        self.dtype = np.dtype(np.float32)

    @property
    def shape(self):
        return (len(self.features),) + self.features.feature_shape

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        return len(self.features)

    def __repr__(self):
        return (f"VariantRows(variant={self.features.shifts[self.variant]}, shape={self.shape},"
                f" of {self.features!r})")

    def without_rows(self, start, stop):
        """These rows minus [start, stop) (tf_tempered.data.without_block)."""
        return VariantRows(self.features.without_rows(start, stop), self.variant)

    def __getitem__(self, key):
        first, rest = (key[0], key[1:]) if isinstance(key, tuple) else (key, ())
        rows = self.features.rows[first]
        flat = np.atleast_1d(rows)
        out = self.features.read(flat, np.full(len(flat), self.variant)).astype(np.float32)
        out = out[0] if np.ndim(rows) == 0 else out
        return out[tuple(rest)] if rest else out

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out if dtype is None else out.astype(dtype)
