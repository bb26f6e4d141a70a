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
"""The 2-D scattering transform itself: kymatio's filters, computed in threads.

The transform is kymatio's (its filters, padding, subsampling and channel order),
computed here by :class:`_Scattering2D` with the same FFTs batched over angles, the
final low-pass as two small matrix products (φ is separable), in one thread per
core: faster than kymatio's NumPy frontend per core (docs/reproduction.md, "What a run
takes"), and the outputs agree to float32 rounding, ≈ 5e-7 relative
(tests/test_scatternet.py checks them against kymatio).

>>> num_channels(2, 8)
81
"""

import concurrent.futures
import contextlib
import functools
import os
import time

import numpy as np

__all__ = ["num_channels", "kymatio_modules", "as_nhwc", "check_transform", "Progress",
           "transform_chunks", "compute", "CHUNK", "INSTALL_HINT"]

INSTALL_HINT = ('ScatterNet features need kymatio: pip install "kymatio>=0.3" '
                '(a dependency of tf_tempered: pip install -e . installs it).')
CHUNK = 256  # images per transform call: bounds its memory (≈ 0.1 GB per thread)


def num_channels(J=2, L=8):
    """Scattering channels per input channel: 1 + J·L + L²·J(J-1)/2 (81 for J=2, L=8).

    >>> num_channels(2, 8), num_channels(3, 8)
    (81, 217)
    """
    return 1 + J * L + L * L * J * (J - 1) // 2


def kymatio_modules():
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


def as_nhwc(images):
    x = np.asarray(images)
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4 or not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"images must be a float array [N, H, W] or [N, H, W, C], got dtype "
                         f"{x.dtype} and shape {x.shape}. Fix: e.g. images.astype('float32') "
                         "/ 255.")
    return np.ascontiguousarray(x, dtype=np.float32)


def check_transform(J, L, shape):
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
        filter_bank, compute_padding, self.version = kymatio_modules()
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


class Progress:
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


def transform_chunks(tasks, J, L, shape, progress):
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
    size = chunk_rows or max(1, CHUNK // c)
    starts = range(0, n, size)
    # kymatio transforms the last two axes: [n, C, H, W] -> planes [n·C, H, W].
    tasks = (np.ascontiguousarray(np.moveaxis(x[s:s + size], -1, 1)).reshape(-1, h, w)
             for s in starts)
    for start, out in zip(starts, transform_chunks(tasks, J, L, (h, w), progress)):
        rows = out.shape[0] // c
        yield start, np.moveaxis(out.reshape(rows, -1, *out.shape[-2:]), 1, -1)


def compute(x, J, L, progress=None):
    n, h, w, c = x.shape
    out = np.empty((n, h // 2 ** J, w // 2 ** J, c * num_channels(J, L)), np.float32)
    progress = progress or Progress("", 0, False)
    for start, features in _features_of(x, J, L, progress):
        out[start:start + len(features)] = features
    return out
