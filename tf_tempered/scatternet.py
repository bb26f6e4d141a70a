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
"""ScatterNet features (Tramèr & Boneh, ICLR 2021) and the small CNN trained on them.

The 2-D scattering transform (Mallat; Oyallon & Mallat) of an image x with a
Gaussian low-pass φ_J and Morlet wavelets ψ_{j,θ} (scales j < J, L angles θ)::

    S0 x = x ⋆ φ_J                               (1 channel)
    S1 x = |x ⋆ ψ_{j1,θ1}| ⋆ φ_J                  (J·L channels)
    S2 x = ||x ⋆ ψ_{j1,θ1}| ⋆ ψ_{j2,θ2}| ⋆ φ_J    (j1 < j2: L²·J(J-1)/2 channels)

each subsampled by 2^J. For J=2, L=8 a 28×28 image gives 1 + 16 + 64 = 81
channels at 7×7. The transform is fixed and public (no parameter is learned from
the data), so computing it costs no privacy: :func:`scattering_features`
computes it once per image array and caches it on disk, keyed by the transform
(J, L, kymatio version), the array's shape and the SHA-256 of its bytes, so a
cached file is never used for other images.

The transform is kymatio's (its filters, padding, subsampling and channel order),
computed here by :class:`_Scattering2D` with the same FFTs batched over angles, the
final low-pass as two small matrix products (φ is separable), in one thread per
core: faster than kymatio's NumPy frontend per core (docs/reproduction.md, "What a run
takes"), and the outputs agree to float32 rounding, ≈ 5e-7 relative
(tests/test_scatternet.py checks them against kymatio).

Layout: channels-last ``[N, H / 2^J, W / 2^J, C · K]`` with K = :func:`num_channels`;
channel ``c · K + k`` is kymatio's coefficient k of input channel c (k = 0 is S0,
then S1 by (j1, θ1), then S2 by (j1, θ1, j2, θ2)).

Shifted copies (augmentation multiplicity, ``--augmult``):
:func:`shifted_scattering_features` caches the features of the images shifted by
every (dy, dx) within ±s pixels (zero fill), and with ``flip`` of those shifted
images mirrored left-right too, one float16 ``.npy`` file per variant, written chunk
by chunk; it returns a :class:`ShiftedFeatures`, which reads the rows
a training batch needs from those files (memory-mapped, the pages released after
each read) instead of holding them in memory. A shift cannot be applied to the
features exactly (they are subsampled by 2^J = 4, and kymatio pads by reflection),
nor can a mirror (the oriented wavelets' channels and the subsampling grid would
move), so every variant is transformed from the shifted (mirrored) images themselves.

Cache (``$TF_TEMPERED_CACHE_DIR/scatternet``, default
``~/.cache/tf_tempered/scatternet``; its size for ``--recipe=best``:
docs/reproduction.md, "What a run takes"): the features of each image array, float32,
and of each shifted or mirrored copy, float16 (the plain copy is read from the float32
file).
Files can be deleted at any time; they are recomputed when needed.

:func:`scatternet_cnn` is Tramèr & Boneh's CNN for MNIST / Fashion-MNIST on these
features: GroupNorm (no trainable affine parameters, data-independent: each
example is normalized by its own statistics, so it costs no privacy and needs no
per-example gradient) → Conv 16, 3×3, stride 2 → act → Conv 32, 3×3 → act →
Dense 32 → act → Dense num_classes.

Needs kymatio (a dependency of tf_tempered; ``pip install "kymatio>=0.3"``) for the
features only; the model builders do not.
"""

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import mmap
import os
import pathlib
import tempfile
import threading
import time
import warnings

import numpy as np

from tf_tempered import augment
from tf_tempered._compat import keras, tf
from tf_tempered.layers import WeightStandardizedConv2D
from tf_tempered.models import resolve_activation

__all__ = ["num_channels", "scattering_features", "shifted_scattering_features",
           "ShiftedFeatures", "scatter_dataset", "scatternet_cnn", "scatternet_linear",
           "default_cache_dir", "CACHE_DIR_ENV", "INSTALL_HINT"]

INSTALL_HINT = ('ScatterNet features need kymatio: pip install "kymatio>=0.3" '
                '(a dependency of tf_tempered: pip install -e . installs it).')
CACHE_DIR_ENV = "TF_TEMPERED_CACHE_DIR"  # shared with tf_tempered.privacy.native
_OLD_CACHE_ENV = "TF_TEMPERED_CACHE"  # read before; deprecated
_CHUNK = 256  # images per transform call: bounds its memory (≈ 0.1 GB per thread)
_PROGRESS_MIN = 10_000  # transforms from which progress is printed by default


def num_channels(J=2, L=8):
    """Scattering channels per input channel: 1 + J·L + L²·J(J-1)/2 (81 for J=2, L=8).

    >>> num_channels(2, 8), num_channels(3, 8)
    (81, 217)
    """
    return 1 + J * L + L * L * J * (J - 1) // 2


def _kymatio():
    """(kymatio's 2-D filter bank module, its padding function, kymatio's version)."""
    try:
        import kymatio  # pylint: disable=g-import-not-at-top
        # The 2-D modules themselves: `kymatio.numpy` also imports the 3-D transform,
        # which fails on SciPy >= 1.15 (scipy.special.sph_harm is gone).
        # pylint: disable=g-import-not-at-top
        from kymatio.scattering2d.filter_bank import filter_bank
        from kymatio.scattering2d.utils import compute_padding
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return filter_bank, compute_padding, kymatio.__version__


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


def _as_nhwc(images):
    x = np.asarray(images)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"images must be a float array [N, H, W] or [N, H, W, C], got dtype "
                         f"{x.dtype} and shape {x.shape}. Fix: e.g. images.astype('float32') "
                         "/ 255.")
    return np.ascontiguousarray(x, dtype=np.float32)


def _check_transform(J, L, shape):
    for name, value in (("J", J), ("L", L)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: it must be a positive integer.")
    if any(s % 2 ** J for s in shape):
        raise ValueError(f"J={J} needs image sides divisible by 2^J={2 ** J}, got {shape}. "
                         "Fix: a smaller J, or pad the images.")


def _blocks(z, k):
    """[..., M, N] -> [..., k·k, (M/k)·(N/k)], block (a, b) of (M/k)×(N/k) at a·k + b."""
    *lead, rows, cols = z.shape
    m, n = rows // k, cols // k
    z = z.reshape(tuple(lead) + (k, m, k, n)).swapaxes(-3, -2)
    return np.ascontiguousarray(z).reshape(tuple(lead) + (k * k, m * n))


class _Scattering2D:
    """kymatio's 2-D scattering (``ScatteringNumPy2D(J, shape, L)``), computed faster.

    The same steps as kymatio's ``scattering2d``: reflection padding, FFT, products
    with its Fourier-domain filters, subsampling by periodization (the mean of the
    k×k blocks of the spectrum), inverse FFT, modulus. Differences, all exact in
    exact arithmetic: the products and the periodization are one contraction over
    the blocks (``einsum``) for all L angles at once, and each low-pass output (φ
    filtering, subsampling by 2^(J−j), unpadding) is ``A·U·Bᵀ`` with A, B the
    sampled circular convolutions by φ's two 1-D factors (φ is a periodized isotropic
    Gaussian: separable; checked).
    """

    def __init__(self, J, L, shape):
        filter_bank, compute_padding, self.version = _kymatio()
        rows, cols = shape
        self.J, self.L = J, L
        padded = compute_padding(rows, cols, J)
        self.pads = ((padded[0] - rows) // 2, (padded[0] - rows + 1) // 2,
                     (padded[1] - cols) // 2, (padded[1] - cols + 1) // 2)
        self.out_shape = (rows // 2 ** J, cols // 2 ** J)
        filters = filter_bank(padded[0], padded[1], J, L)
        psi = filters["psi"]
        # Wavelets of scale j applied at resolution r (subsampled by 2^(j−r) after):
        # [L, blocks, 2·m·n] float32 (each value twice: a complex64 array viewed as
        # float32 interleaves real and imaginary parts), the mean's 1/k² folded in.
        self.psi = {}
        for j in range(J):
            for r in range(min(j + 1, max(J - 1, 1))):  # the levels kymatio builds
                k = 2 ** (j - r)
                stack = np.stack([p["levels"][r] for p in psi if p["j"] == j])
                self.psi[j, r] = np.repeat(_blocks(stack.astype(np.float32), k)
                                           * np.float32(1.0 / (k * k)), 2, axis=-1)
        self.low = []  # per resolution r: (Aᵀ, Bᵀ), float32
        for r, phi in enumerate(filters["phi"]["levels"]):
            spatial = np.real(np.fft.ifft2(np.asarray(phi, np.float64)))
            u, s, vt = np.linalg.svd(spatial)
            if s[1] > 1e-6 * s[0]:  # never for kymatio's φ; a guard against a change there
                raise RuntimeError("kymatio's low-pass filter is not separable; use kymatio's "
                                   "own transform.")
            factors = u[:, 0] * np.sqrt(s[0]), vt[0] * np.sqrt(s[0])
            step = 2 ** (J - r)
            matrices = []
            for f, out in zip(factors, self.out_shape):
                # Output p (after unpadding) samples the convolution at step·(p + 1).
                idx = (step * np.arange(1, out + 1)[:, None] - np.arange(len(f))[None]) % len(f)
                matrices.append(np.ascontiguousarray(f[idx].T, np.float32))
            self.low.append(tuple(matrices))

    def _lowpass(self, u, r):
        """φ-filtered, subsampled, unpadded: [..., Mr, Nr] -> [..., h, w]."""
        a_t, b_t = self.low[r]
        *lead, rows, cols = u.shape
        h, w = self.out_shape
        t = (u.reshape(-1, cols) @ b_t).reshape(-1, rows, w).swapaxes(-1, -2)
        t = np.ascontiguousarray(t).reshape(-1, rows) @ a_t  # [..., w, h]
        return t.reshape(tuple(lead) + (w, h)).swapaxes(-1, -2)

    def _wavelets(self, spectrum, j, r):
        """|ifft(periodize(spectrum · ψ_{j,θ}.levels[r], 2^(j−r)))|, all θ: [..., L, m, n]."""
        import scipy.fft  # pylint: disable=g-import-not-at-top
        k = 2 ** (j - r)
        *lead, rows, cols = spectrum.shape
        blocks = _blocks(spectrum, k).view(np.float32)
        prod = np.einsum("ibp,tbp->itp", blocks.reshape((-1,) + blocks.shape[-2:]),
                         self.psi[j, r])
        prod = prod.view(np.complex64).reshape(tuple(lead) + (self.L, rows // k, cols // k))
        return np.abs(scipy.fft.ifft2(prod, overwrite_x=True))

    def __call__(self, planes):
        """planes [n, H, W] float32 -> [n, K, h, w] float32, kymatio's channel order."""
        import scipy.fft  # pylint: disable=g-import-not-at-top
        top, bottom, left, right = self.pads
        padded = np.pad(planes, ((0, 0), (top, bottom), (left, right)), mode="reflect")
        spectrum = scipy.fft.fft2(padded)
        order1, order2 = [], {}
        for j1 in range(self.J):
            u1 = self._wavelets(spectrum, j1, 0)  # [n, L, ...] at resolution j1
            order1.append(self._lowpass(u1, j1))
            if j1 + 1 < self.J:
                u1_spectrum = scipy.fft.fft2(u1)
                for j2 in range(j1 + 1, self.J):  # [n, L (θ1), L (θ2), h, w]
                    order2[j1, j2] = self._lowpass(self._wavelets(u1_spectrum, j2, j1), j2)
        out = [self._lowpass(padded, 0)[:, None], np.concatenate(order1, axis=1)]
        for j1 in range(self.J - 1):  # kymatio: by (j1, θ1), then (j2, θ2)
            for theta1 in range(self.L):
                out.extend(order2[j1, j2][:, theta1] for j2 in range(j1 + 1, self.J))
        return np.concatenate(out, axis=1)


@functools.lru_cache(maxsize=8)
def _transform(J, L, shape):
    return _Scattering2D(J, L, shape)


def _threads():
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, 8))


class _Progress:
    """Prints '<label>: done/total (p%), t s, about r s left' about every 10%, or 30 s."""

    def __init__(self, label, total, enabled):
        self.label, self.total, self.enabled = label, total, enabled and total > 0
        self.done, self.start = 0, time.monotonic()
        self._next, self._last = total / 10, self.start
        if self.enabled:
            print(f"{label}: computing {total} transforms ({_threads()} threads)", flush=True)

    def update(self, count):
        self.done += count
        now = time.monotonic()
        if self.enabled and (self.done >= self._next or now - self._last >= 30
                             or self.done == self.total):
            elapsed = now - self.start
            left = elapsed * (self.total - self.done) / max(self.done, 1)
            print(f"{self.label}: {self.done}/{self.total} ({100 * self.done / self.total:.0f}%),"
                  f" {elapsed:.0f} s, about {left:.0f} s left", flush=True)
            self._next = self.done + self.total / 10
            self._last = now


def _one_blas_thread():
    """The BLAS's own threads off (threadpoolctl, which scikit-learn brings) while the
    transform's threads run: its small matrix products gain nothing from them, and the
    threads' busy-waiting slows the transform down on a shared machine
    (docs/reproduction.md, "What a run takes")."""
    try:
        from threadpoolctl import threadpool_limits  # pylint: disable=g-import-not-at-top
    except ImportError:  # pragma: no cover - installed with scikit-learn
        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _transform_chunks(tasks, J, L, shape, progress):
    """Runs ``tasks`` (planes [n, H, W] float32 each) through the transform in threads;
    yields each result, [n, K, h, w] float32, in order, at most 2·threads ahead."""
    transform = _transform(J, L, tuple(shape))
    threads = _threads()
    with _one_blas_thread(), concurrent.futures.ThreadPoolExecutor(threads) as pool:
        pending = []
        for task in tasks:
            pending.append(pool.submit(transform, task))
            if len(pending) >= 2 * threads:
                result = pending.pop(0).result()
                progress.update(len(result))
                yield result
        for future in pending:
            result = future.result()
            progress.update(len(result))
            yield result


def _features_of(x, J, L, progress, chunk_rows=None):
    """Yields (start, features [n, h, w, C·K] float32) for the chunks of x [N, H, W, C]."""
    n, h, w, c = x.shape
    size = chunk_rows or max(1, _CHUNK // c)
    starts = range(0, n, size)
    # kymatio transforms the last two axes: [n, C, H, W] -> planes [n·C, H, W].
    tasks = (np.ascontiguousarray(np.moveaxis(x[s:s + size], -1, 1)).reshape(-1, h, w)
             for s in starts)
    for start, out in zip(starts, _transform_chunks(tasks, J, L, (h, w), progress)):
        rows = out.shape[0] // c
        yield start, np.moveaxis(out.reshape(rows, -1, *out.shape[-2:]), 1, -1)


def _compute(x, J, L, progress=None):
    n, h, w, c = x.shape
    out = np.empty((n, h // 2 ** J, w // 2 ** J, c * num_channels(J, L)), np.float32)
    progress = progress or _Progress("", 0, False)
    for start, features in _features_of(x, J, L, progress):
        out[start:start + len(features)] = features
    return out


def _digest(x):
    return hashlib.sha256(x.tobytes()).hexdigest()[:20]


def _plain_path(folder, x, J, L, digest):
    _, _, version = _kymatio()
    return folder / (f"scat_J{J}_L{L}_kymatio{version}_" + "x".join(map(str, x.shape))
                     + f"_{digest}.npy")


def _show(progress, n):
    """progress=None: print for arrays of at least _PROGRESS_MIN transforms."""
    return n >= _PROGRESS_MIN if progress is None else bool(progress)


def _size(nbytes):
    return f"{nbytes / 1e9:.2f} GB" if nbytes >= 1e9 else f"{nbytes / 1e6:.0f} MB"


def scattering_features(images, *, J=2, L=8, cache_dir=None, cache=True, progress=None):
    """The scattering transform of ``images``, channels-last (see the module docstring).

    Args:
        images: float array [N, H, W] or [N, H, W, C] (H and W divisible by 2^J).
        J, L: scales and angles of the transform (Tramèr & Boneh: J=2, L=8).
        cache_dir: where to keep the result (default :func:`default_cache_dir`); the
            file name holds J, L, the kymatio version, the shape and the SHA-256 of
            ``images``, so other images never reuse it.
        cache: False computes without reading or writing the cache.
        progress: print what is computed or read, and the progress of a computation
            (about every 10%); None: for arrays of at least 10 000 images.

    Returns:
        float32 array [N, H / 2^J, W / 2^J, C · num_channels(J, L)].
    """
    x = _as_nhwc(images)
    _check_transform(J, L, x.shape[1:3])
    _kymatio()  # ImportError naming the pip command, before any work
    show = _show(progress, len(x) * x.shape[3])
    label = f"ScatterNet features (J={J}, L={L}) of {len(x)} images"
    if not cache:
        return _compute(x, J, L, _Progress(label, len(x) * x.shape[3], show))
    folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = _plain_path(folder, x, J, L, _digest(x))
    expected = (len(x), x.shape[1] // 2 ** J, x.shape[2] // 2 ** J,
                x.shape[3] * num_channels(J, L))
    if path.exists():
        cached = np.load(path)
        if cached.shape == expected and cached.dtype == np.float32:
            if show:
                print(f"{label}: read from the cache, {path} ({_size(cached.nbytes)})",
                      flush=True)
            return cached
    if show:
        print(f"{label}: not cached yet, writing {path} ({_size(np.prod(expected) * 4)})",
              flush=True)
    features = _compute(x, J, L, _Progress(label, len(x) * x.shape[3], show))
    folder.mkdir(parents=True, exist_ok=True)
    # Write then rename: a killed run never leaves a truncated file under the final name.
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".npy.tmp", delete=False) as f:
        np.save(f, features)
    os.chmod(f.name, 0o644)  # a shared cache: NamedTemporaryFile creates it owner-only
    os.replace(f.name, path)
    return features


class _RowFile:
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
        self._rows = _as_rows(self.array)

    def take(self, rows):
        order = np.argsort(rows, kind="stable")  # in file order
        out = np.empty((len(rows),) + self.shape[1:], self.dtype)
        _as_rows(out)[order] = self._rows[rows[order]]
        if hasattr(self._map, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)
        return out


def _as_rows(array):
    """A C-contiguous array [N, ...] as N opaque rows (fancy indexing then copies whole
    rows, several times faster than element by element)."""
    row = array.dtype.itemsize * int(np.prod(array.shape[1:]))
    return array.reshape(len(array), -1).view(np.dtype((np.void, row)))[:, 0]


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
                self._files = [_RowFile(p) for p in self.paths]
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
            _as_rows(out)[where] = _as_rows(block)
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


def _shifted_path(plain, dy, dx, mirrored, dtype):
    mirror = "_mirror" if mirrored else ""
    return plain.with_name(f"{plain.stem}{mirror}_shift{dy:+d}{dx:+d}_{np.dtype(dtype).name}.npy")


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
    x = _as_nhwc(images)
    shifts = _variants(max_shift, flip)
    _check_transform(J, L, x.shape[1:3])
    _kymatio()
    n, h, w, c = x.shape
    feature_shape = (h // 2 ** J, w // 2 ** J, c * num_channels(J, L))
    plain_variant = (0, 0, False)
    if cache:
        folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
        plain = _plain_path(folder, x, J, L, _digest(x))
        paths = [plain if shift == plain_variant else _shifted_path(plain, *shift, dtype)
                 for shift in shifts]
        if not _valid(plain, (n,) + feature_shape, np.float32):
            scattering_features(x, J=J, L=L, cache_dir=folder, progress=progress)
        todo = [i for i, (p, shift) in enumerate(zip(paths, shifts))
                if shift != plain_variant and not _valid(p, (n,) + feature_shape, dtype)]
    else:
        todo = [i for i, shift in enumerate(shifts)]
    show = _show(progress, n * c * (len(todo) or len(shifts)))  # all cached: says so
    label = (f"ScatterNet features (J={J}, L={L}) of {len(todo)} shifted "
             f"{'or mirrored ' if flip else ''}copies of {n} images")
    if show and todo and cache:
        print(f"{label}: not cached yet, writing {len(todo)} files of "
              f"{_size(n * np.prod(feature_shape) * np.dtype(dtype).itemsize)} in {folder}",
              flush=True)
    elif show and cache:
        print(f"ScatterNet features of {len(shifts)} {'shifts and mirrors' if flip else 'shifts'}"
              f" of {n} images: cached in {folder} (read per batch)", flush=True)
    progress_bar = _Progress(label, n * c * len(todo), show)
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


def _valid(path, shape, dtype):
    """Whether ``path`` is a .npy file of this shape and dtype (header only)."""
    try:
        array = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return False
    ok = array.shape == tuple(shape) and array.dtype == np.dtype(dtype)
    del array
    return ok


def _shifted_chunks(x, shifts, J, L, progress):
    """Yields (variant index, (start, features)) for every chunk of x under every
    (dy, dx, mirrored) variant: shifted, then mirrored left-right if ``mirrored``."""
    n, h, w, c = x.shape
    s = max([max(abs(dy), abs(dx)) for dy, dx, _ in shifts] + [0])
    size = max(1, _CHUNK // c)

    def tasks():
        for start in range(0, n, size):
            padded = np.pad(x[start:start + size], [(0, 0), (s, s), (s, s), (0, 0)])
            for dy, dx, mirrored in shifts:
                crop = padded[:, s - dy:s - dy + h, s - dx:s - dx + w]
                if mirrored:
                    crop = crop[:, :, ::-1]
                yield np.ascontiguousarray(np.moveaxis(crop, -1, 1)).reshape(-1, h, w)

    keys = ((v, start) for start in range(0, n, size) for v in range(len(shifts)))
    for (v, start), out in zip(keys, _transform_chunks(tasks(), J, L, (h, w), progress)):
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


def scatter_dataset(dataset, *, J=2, L=8, cache_dir=None, progress=None):
    """A copy of ``dataset`` (tf_tempered.data.Dataset) with scattering features as images."""
    return dataclasses.replace(
        dataset, x_train=scattering_features(dataset.x_train, J=J, L=L, cache_dir=cache_dir,
                                             progress=progress),
        x_test=scattering_features(dataset.x_test, J=J, L=L, cache_dir=cache_dir,
                                   progress=progress),
        source=f"{dataset.source} -> scattering J={J} L={L}")


def scatternet_cnn(activation="tanh", *, input_shape=(7, 7, 81), num_classes=10, groups=27,
                   normalization=None, weight_standardization=False, name="scatternet_cnn"):
    """Tramèr & Boneh's MNIST / Fashion-MNIST CNN on scattering features.

    GroupNorm(groups, no affine parameters; ``groups=None``: no normalization) →
    Conv2D 16, 3×3, stride 2, 'same' + act → Conv2D 32, 3×3, 'same' + act → Flatten →
    Dense 32 + act → Dense num_classes (logits). ``activation`` takes any form of
    :func:`tf_tempered.models.resolve_activation`. ``normalization=(mean, variance)``
    (per channel; with ``groups=None``): a frozen (x − mean) / sqrt(variance) first
    instead, e.g. DP-released statistics (:mod:`tf_tempered.feature_stats`).
    ``weight_standardization=True``: both convolutions are
    :class:`tf_tempered.WeightStandardizedConv2D` with ``scaled=True`` (same
    parameters; no normalization follows them, so the fan-in scaling keeps the
    activations' inputs near unit variance).

    >>> scatternet_cnn("relu").count_params()
    33066
    >>> scatternet_cnn(weight_standardization=True).get_layer("conv2").scaled
    True
    """
    make_activation = resolve_activation(activation)
    conv = keras.layers.Conv2D
    if weight_standardization:
        conv = functools.partial(WeightStandardizedConv2D, scaled=True)
    inputs, x = _normalized_input(input_shape, groups, normalization)
    x = conv(16, 3, strides=2, padding="same", name="conv1")(x)
    x = make_activation()(x)
    x = conv(32, 3, padding="same", name="conv2")(x)
    x = make_activation()(x)
    x = keras.layers.Flatten(name="flatten")(x)
    x = keras.layers.Dense(32, name="dense1")(x)
    x = make_activation()(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def scatternet_linear(*, input_shape=(7, 7, 81), num_classes=10, groups=27, normalization=None,
                      name="scatternet_linear"):
    """Tramèr & Boneh's linear model on scattering features: logits = W·norm(x) + b.

    The input is normalized as in :func:`scatternet_cnn` (``groups`` or
    ``normalization``), flattened, and one Dense layer gives the logits.

    >>> scatternet_linear().count_params()
    39700
    """
    inputs, x = _normalized_input(input_shape, groups, normalization)
    x = keras.layers.Flatten(name="flatten")(x)
    outputs = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.Model(inputs, outputs, name=name)


def _normalized_input(input_shape, groups, normalization):
    """(the Input, its normalized tensor): GroupNorm, frozen (mean, variance) or neither."""
    channels = input_shape[-1]
    if groups is not None and (isinstance(groups, bool) or not isinstance(groups, int)
                               or groups < 1 or channels % groups):
        raise ValueError(f"groups={groups!r} is invalid: it must divide the {channels} input "
                         "channels (e.g. 27, 81, 9, 3 or 1), or be None (no normalization).")
    if normalization is not None and groups is not None:
        raise ValueError("give groups=None with normalization=(mean, variance): the input is "
                         "normalized one way or the other, not both.")
    inputs = keras.Input(shape=tuple(input_shape), name="scattering")
    x = inputs
    if normalization is not None:
        mean, variance = (np.asarray(v, dtype=np.float32).reshape(-1) for v in normalization)
        if mean.shape != (channels,) or variance.shape != (channels,) or (variance <= 0).any():
            raise ValueError(f"normalization must be (mean, variance) of {channels} channels "
                             f"each, variance > 0; got shapes {mean.shape}, {variance.shape}.")
        # Frozen constants (no trainable weights: nothing for DP-SGD to clip).
        x = keras.layers.Normalization(mean=mean, variance=variance, name="feature_norm")(x)
    if groups is not None:
        # No center/scale: nothing trainable, so DP-SGD has nothing here to clip.
        x = keras.layers.GroupNormalization(groups=groups, center=False, scale=False,
                                            epsilon=1e-5, name="group_norm")(x)
    return inputs, x
