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
computes it once per image array with kymatio's NumPy frontend and caches it on
disk, keyed by the transform (J, L, kymatio version), the array's shape and the
SHA-256 of its bytes, so a cached file is never used for other images.

Layout: channels-last ``[N, H / 2^J, W / 2^J, C · K]`` with K = :func:`num_channels`;
channel ``c · K + k`` is kymatio's coefficient k of input channel c (k = 0 is S0,
then S1 by (j1, θ1), then S2 by (j1, θ1, j2, θ2)).

:func:`scatternet_cnn` is Tramèr & Boneh's CNN for MNIST / Fashion-MNIST on these
features: GroupNorm (no trainable affine parameters, data-independent: each
example is normalized by its own statistics, so it costs no privacy and needs no
per-example gradient) → Conv 16, 3×3, stride 2 → act → Conv 32, 3×3 → act →
Dense 32 → act → Dense num_classes.

Needs kymatio (``pip install "tf_tempered[scatternet]"`` or ``pip install kymatio``)
for the features only; the model builder does not.
"""

import dataclasses
import functools
import hashlib
import os
import pathlib
import tempfile

import numpy as np

from tf_tempered._compat import keras
from tf_tempered.layers import WeightStandardizedConv2D
from tf_tempered.models import resolve_activation

__all__ = ["num_channels", "scattering_features", "shifted_scattering_features",
           "scatter_dataset", "scatternet_cnn", "scatternet_linear", "default_cache_dir",
           "INSTALL_HINT"]

INSTALL_HINT = ('ScatterNet features need kymatio: pip install "kymatio>=0.3" '
                '(or pip install "tf_tempered[scatternet]").')
_CHUNK = 2000  # images per kymatio call: bounds the transform's memory


def num_channels(J=2, L=8):
    """Scattering channels per input channel: 1 + J·L + L²·J(J-1)/2 (81 for J=2, L=8).

    >>> num_channels(2, 8), num_channels(3, 8)
    (81, 217)
    """
    return 1 + J * L + L * L * J * (J - 1) // 2


def _kymatio_scattering(J, L, shape):
    try:
        import kymatio  # pylint: disable=g-import-not-at-top
        # The 2-D frontend module itself: `kymatio.numpy` also imports the 3-D
        # transform, which fails on SciPy >= 1.15 (scipy.special.sph_harm is gone).
        from kymatio.scattering2d.frontend.numpy_frontend import (  # pylint: disable=g-import-not-at-top
            ScatteringNumPy2D)
    except ImportError as e:
        raise ImportError(INSTALL_HINT) from e
    return ScatteringNumPy2D(J=J, shape=tuple(shape), L=L), kymatio.__version__


def default_cache_dir():
    """``$TF_TEMPERED_CACHE/scatternet``, else ``~/.cache/tf_tempered/scatternet``."""
    root = os.environ.get("TF_TEMPERED_CACHE") or pathlib.Path.home() / ".cache" / "tf_tempered"
    return pathlib.Path(root) / "scatternet"


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


def _compute(x, J, L):
    n, h, w, c = x.shape
    scattering, _ = _kymatio_scattering(J, L, (h, w))
    planes = np.moveaxis(x, -1, 1)  # [N, C, H, W]: kymatio transforms the last two axes
    out = np.empty((n, c * num_channels(J, L), h // 2 ** J, w // 2 ** J), np.float32)
    for start in range(0, n, _CHUNK):
        s = scattering(planes[start:start + _CHUNK])  # [n, C, K, h', w']
        out[start:start + len(s)] = s.reshape(len(s), -1, *s.shape[-2:])
    return np.ascontiguousarray(np.moveaxis(out, 1, -1))


def scattering_features(images, *, J=2, L=8, cache_dir=None, cache=True):
    """The scattering transform of ``images``, channels-last (see the module docstring).

    Args:
        images: float array [N, H, W] or [N, H, W, C] (H and W divisible by 2^J).
        J, L: scales and angles of the transform (Tramèr & Boneh: J=2, L=8).
        cache_dir: where to keep the result (default :func:`default_cache_dir`); the
            file name holds J, L, the kymatio version, the shape and the SHA-256 of
            ``images``, so other images never reuse it.
        cache: False computes without reading or writing the cache.

    Returns:
        float32 array [N, H / 2^J, W / 2^J, C · num_channels(J, L)].
    """
    x = _as_nhwc(images)
    _check_transform(J, L, x.shape[1:3])
    if not cache:
        return _compute(x, J, L)
    _, version = _kymatio_scattering(J, L, x.shape[1:3])
    digest = hashlib.sha256(x.tobytes()).hexdigest()[:20]
    folder = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = folder / (f"scat_J{J}_L{L}_kymatio{version}_" + "x".join(map(str, x.shape))
                     + f"_{digest}.npy")
    if path.exists():
        cached = np.load(path)
        expected = (len(x), x.shape[1] // 2 ** J, x.shape[2] // 2 ** J,
                    x.shape[3] * num_channels(J, L))
        if cached.shape == expected and cached.dtype == np.float32:
            return cached
    features = _compute(x, J, L)
    folder.mkdir(parents=True, exist_ok=True)
    # Write then rename: a killed run never leaves a truncated file under the final name.
    with tempfile.NamedTemporaryFile(dir=folder, suffix=".npy.tmp", delete=False) as f:
        np.save(f, features)
    os.chmod(f.name, 0o644)  # a shared cache: NamedTemporaryFile creates it owner-only
    os.replace(f.name, path)
    return features


def shifted_scattering_features(images, *, max_shift, J=2, L=8, cache_dir=None, cache=True,
                                dtype=np.float16):
    """Scattering features of ``images`` under every integer shift within ±``max_shift`` pixels.

    Returns [N, V, H / 2^J, W / 2^J, K] with V = (2·max_shift + 1)²: variant
    v = a·(2s + 1) + b holds the features of the images zero-padded by s = max_shift
    and cropped back to H × W at offset (a, b), i.e. shifted by (s − a, s − b) as
    :func:`tf_tempered.augment.random_shift_flip` shifts them. A uniformly random
    variant per augmented copy (:func:`tf_tempered.augment.pick_variants`) is thus
    exactly random-shift augmentation of the images, with the transform computed once
    per shift (cached like :func:`scattering_features`) instead of once per copy.
    Stored as ``dtype`` (float16 by default: V copies of the features; about
    V·N·K·(H/2^J)·(W/2^J)·2 bytes).

    >>> shifted_scattering_features(np.zeros((2, 8, 8)), max_shift=1, J=1, L=2,
    ...                             cache=False).shape
    (2, 9, 4, 4, 3)
    """
    x = _as_nhwc(images)
    if isinstance(max_shift, bool) or not isinstance(max_shift, (int, np.integer)) \
            or max_shift < 0:
        raise ValueError(f"max_shift={max_shift!r} is invalid: it must be an integer >= 0 "
                         "(pixels).")
    s, (n, h, w, c) = int(max_shift), x.shape
    padded = np.pad(x, [(0, 0), (s, s), (s, s), (0, 0)])
    out = None
    for a in range(2 * s + 1):
        for b in range(2 * s + 1):
            features = scattering_features(padded[:, a:a + h, b:b + w], J=J, L=L,
                                           cache_dir=cache_dir, cache=cache)
            if out is None:
                out = np.empty((n, (2 * s + 1) ** 2) + features.shape[1:], dtype)
            out[:, a * (2 * s + 1) + b] = features
    return out


def scatter_dataset(dataset, *, J=2, L=8, cache_dir=None):
    """A copy of ``dataset`` (tf_tempered.data.Dataset) with scattering features as images."""
    return dataclasses.replace(
        dataset, x_train=scattering_features(dataset.x_train, J=J, L=L, cache_dir=cache_dir),
        x_test=scattering_features(dataset.x_test, J=J, L=L, cache_dir=cache_dir),
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
