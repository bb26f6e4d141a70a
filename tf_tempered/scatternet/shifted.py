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
images mirrored left-right too, one ``.npy`` file per variant (float16, or 8-bit
codes: :mod:`~tf_tempered.scatternet.codes`), written chunk by chunk; it returns a
:class:`~tf_tempered.scatternet.shifted_rows.ShiftedFeatures`, which reads the rows a
training batch needs from those files (:class:`~tf_tempered.scatternet.cache.RowFile`)
instead of holding them in memory. A shift cannot be applied to the
features exactly (they are subsampled by 2^J = 4, and kymatio pads by reflection),
nor can a mirror (the oriented wavelets' channels and the subsampling grid would
move), so every variant is transformed from the shifted (mirrored) images themselves.
"""

import os
import pathlib
import tempfile

import numpy as np

from tf_tempered.scatternet import codes
from tf_tempered.scatternet.cache import (default_cache_dir, digest, human_size, is_valid_npy,
                                          plain_path, shifted_path)
from tf_tempered.scatternet.features import scattering_features, show_progress
from tf_tempered.scatternet.shifted_rows import ShiftedFeatures
from tf_tempered.scatternet.transform import (CHUNK, Progress, as_nhwc, check_transform,
                                              kymatio_modules, num_channels, transform_chunks)

__all__ = ["shifted_scattering_features"]


def shifted_scattering_features(images, *, max_shift, flip=False, J=2, L=8, cache_dir=None,
                                cache=True, storage="float16", progress=None):
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
    cache files when asked (nothing is held in memory), computed chunk by chunk the first
    time. ``storage="float16"``: one float16 file per variant other than the plain
    images (N·K·(H/2^J)·(W/2^J)·2 bytes), the unshifted variant being
    :func:`scattering_features`' float32 file, rounded when read; ``"log8"``: one file
    of :mod:`~tf_tempered.scatternet.codes`' bytes per variant, the unshifted one
    included (1 byte a value, read as float32; MNIST's 9 variants: 2.14 GB against
    4.76 GB). With ``cache=False``, the array itself (in memory: float16, or the
    values log8 reads). ``progress`` as in :func:`scattering_features`.

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
    if storage not in codes.STORAGES:
        raise ValueError(f"storage={storage!r} is invalid: one of {', '.join(codes.STORAGES)}.")
    kymatio_modules()
    n, h, w, c = x.shape
    feature_shape = (h // 2 ** J, w // 2 ** J, c * num_channels(J, L))
    if cache:
        folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        paths, todo = _cache_files(x, folder, shifts, J, L, feature_shape, storage, progress)
    else:
        todo = list(range(len(shifts)))
    show = show_progress(progress, n * c * (len(todo) or len(shifts)))  # all cached: says so
    label = (f"ScatterNet features (J={J}, L={L}) of {len(todo)} copies (shifts within "
             f"±{max_shift} px{', mirrored or not' if flip else ''}) of {n} images")
    if show and todo and cache:
        size = n * np.prod(feature_shape) * _STORED[storage].itemsize
        print(f"{label}: not cached yet, writing {len(todo)} files of {human_size(size)} "
              f"({storage}) in {folder}", flush=True)
    elif show and cache:
        print(f"ScatterNet features of {len(shifts)} {'shifts and mirrors' if flip else 'shifts'}"
              f" of {n} images: cached in {folder} (read per batch)", flush=True)
    progress_bar = Progress(label, n * c * len(todo), show)
    if not cache:
        out = np.empty((n, len(shifts)) + feature_shape, _READ[storage])
        for v, (start, features) in _shifted_chunks(x, shifts, J, L, progress_bar):
            if storage == "log8":
                features = codes.decode(codes.encode(features))
            out[start:start + len(features), v] = features
        return out
    if todo:
        folder.mkdir(parents=True, exist_ok=True)
        _write_shifted(x, [shifts[i] for i in todo], [paths[i] for i in todo], J, L,
                       feature_shape, storage, progress_bar)
    return ShiftedFeatures(paths, shifts, np.arange(n), feature_shape, storage)


_STORED, _READ = codes.STORED_DTYPES, codes.READ_DTYPES


def _cache_files(x, folder, shifts, J, L, feature_shape, storage, progress):
    """(each variant's file, the variants whose file is missing); float16 storage computes
    the plain features' float32 file first if it is missing."""
    plain, unshifted = plain_path(folder, x, J, L, digest(x)), (0, 0, False)
    if storage == "float16":
        paths = [plain if shift == unshifted else shifted_path(plain, *shift, storage)
                 for shift in shifts]
        if not is_valid_npy(plain, (len(x),) + feature_shape, np.float32):
            scattering_features(x, J=J, L=L, cache_dir=folder, progress=progress)
    else:
        paths = [shifted_path(plain, *shift, storage) for shift in shifts]
    todo = [i for i, p in enumerate(paths) if p != plain and not is_valid_npy(
        p, (len(x),) + feature_shape, _STORED[storage])]
    return paths, todo


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


def _write_shifted(x, shifts, paths, J, L, feature_shape, storage, progress):
    """Computes the features of every shift, chunk by chunk, into one file per shift."""
    n = len(x)
    files = []
    try:
        for path in paths:
            f = tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy.tmp", delete=False)
            files.append(f)
            np.lib.format.write_array_header_1_0(
                f, {"descr": np.lib.format.dtype_to_descr(_STORED[storage]),
                    "fortran_order": False, "shape": (n,) + tuple(feature_shape)})
        for v, (_, features) in _shifted_chunks(x, shifts, J, L, progress):
            stored = codes.encode(features) if storage == "log8" else features
            files[v].write(np.ascontiguousarray(stored, _STORED[storage]).tobytes())
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
