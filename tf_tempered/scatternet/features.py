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
"""The scattering features of an image array, computed once and cached."""

import dataclasses
import os
import pathlib
import tempfile

import numpy as np

from tf_tempered.scatternet.cache import default_cache_dir, digest, human_size, plain_path
from tf_tempered.scatternet.transform import (Progress, as_nhwc, check_transform, compute,
                                              kymatio_modules, num_channels)

__all__ = ["scattering_features", "scatter_dataset", "show_progress"]

_PROGRESS_MIN = 10_000  # transforms from which progress is printed by default


def show_progress(progress, n):
    """progress=None: print for arrays of at least _PROGRESS_MIN transforms."""
    return n >= _PROGRESS_MIN if progress is None else bool(progress)


def scattering_features(images, *, J=2, L=8, cache_dir=None, cache=True, progress=None,
                        mmap_mode=None):
    """The scattering transform of ``images``, channels-last (see the package docstring).

    Args:
        images: float array [N, H, W] or [N, H, W, C] (H and W divisible by 2^J).
        J, L: scales and angles of the transform (Tramèr & Boneh: J=2, L=8).
        cache_dir: where to keep the result (default :func:`default_cache_dir`); the
            file name holds J, L, the kymatio version, the shape and the SHA-256 of
            ``images``, so other images never reuse it.
        cache: False computes without reading or writing the cache.
        progress: print what is computed or read, and the progress of a computation
            (about every 10%); None: for arrays of at least 10 000 images.
        mmap_mode: None returns the features in memory; "r" returns the cache file
            mapped read-only (np.memmap, as ``np.load(..., mmap_mode="r")``): rows are
            read when used, and only the pages read count in resident memory, while the
            map lives (MNIST's training features: 953 MB). Needs ``cache``.

    Returns:
        float32 array [N, H / 2^J, W / 2^J, C · num_channels(J, L)].
    """
    x = as_nhwc(images)
    check_transform(J, L, x.shape[1:3])
    kymatio_modules()  # ImportError naming the pip command, before any work
    show = show_progress(progress, len(x) * x.shape[3])
    label = f"ScatterNet features (J={J}, L={L}) of {len(x)} images"
    if mmap_mode not in (None, "r"):
        raise ValueError(f"mmap_mode={mmap_mode!r} is invalid: None (in memory) or \"r\" "
                         "(the cache file mapped read-only).")
    if mmap_mode is not None and not cache:
        raise ValueError("mmap_mode='r' maps the cache file: it needs cache=True.")
    if not cache:
        return compute(x, J, L, Progress(label, len(x) * x.shape[3], show))
    folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = plain_path(folder, x, J, L, digest(x))
    expected = (len(x), x.shape[1] // 2 ** J, x.shape[2] // 2 ** J,
                x.shape[3] * num_channels(J, L))
    if path.exists():
        cached = np.load(path, mmap_mode=mmap_mode)
        if cached.shape == expected and cached.dtype == np.float32:
            if show:
                how = "read from" if mmap_mode is None else "mapped from"
                print(f"{label}: {how} the cache, {path} ({human_size(cached.nbytes)})",
                      flush=True)
            return cached
    if show:
        print(f"{label}: not cached yet, writing {path} ({human_size(np.prod(expected) * 4)})",
              flush=True)
    features = compute(x, J, L, Progress(label, len(x) * x.shape[3], show))
    folder.mkdir(parents=True, exist_ok=True)
    # Write then rename: a killed run never leaves a truncated file under the final name.
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".npy.tmp", delete=False) as f:
        np.save(f, features)
    os.chmod(f.name, 0o644)  # a shared cache: NamedTemporaryFile creates it owner-only
    os.replace(f.name, path)
    if mmap_mode is not None:
        del features  # the map instead of a second copy in memory
        return np.load(path, mmap_mode=mmap_mode)
    return features


def scatter_dataset(dataset, *, J=2, L=8, cache_dir=None, progress=None, mmap_mode=None):
    """A copy of ``dataset`` (tf_tempered.data.Dataset) with scattering features as images
    (``mmap_mode`` as in :func:`scattering_features`)."""
    options = dict(J=J, L=L, cache_dir=cache_dir, progress=progress, mmap_mode=mmap_mode)
    return dataclasses.replace(
        dataset, x_train=scattering_features(dataset.x_train, **options),
        x_test=scattering_features(dataset.x_test, **options),
        source=f"{dataset.source} -> scattering J={J} L={L}")
