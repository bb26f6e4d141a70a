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
"""Readers of the dataset files :mod:`tf_tempered.data` loads: IDX, Keras' mnist.npz, CIFAR-10.

Each validates what it reads and raises :class:`DataFormatError` naming the file.
``tf_tempered.data`` re-exports :func:`read_idx` and :class:`DataFormatError`.
"""

import gzip
import io
import pathlib
import pickle
import struct
import tarfile
import zipfile
import zlib

import numpy as np

__all__ = ["DataFormatError", "read_idx", "check_arrays", "find_idx", "load_npz",
           "load_cifar_local", "IDX_FILES", "TITLES"]

TITLES = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"}
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
             "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
CIFAR_DIR = "cifar-10-batches-py"
CIFAR_TARS = ("cifar-10-python.tar.gz", "cifar-10-batches-py.tar.gz")  # official, Keras cache
CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
# First ten training labels of the full sets: catches one set's files filed under the other's name.
_FINGERPRINTS = {"mnist": (5, 0, 4, 1, 9, 2, 1, 3, 1, 4),
                 "fashion_mnist": (9, 0, 0, 3, 0, 2, 7, 2, 5, 5)}


class DataFormatError(ValueError):
    """A data file is truncated, corrupt or not in the expected format; the message names it."""


def read_idx(path, ndim=None):
    """Reads an IDX file of unsigned bytes (gzip-compressed or not) as a uint8 array.

    Checks the magic number, the number of dimensions (if ``ndim`` is given) and
    that the data size matches the header; raises :class:`DataFormatError` otherwise.
    """
    path = pathlib.Path(path)
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as e:
            raise DataFormatError(f"{path}: corrupt or truncated gzip file ({e}). Download it "
                                  "again.") from e
    if len(raw) < 4 or raw[:3] != b"\x00\x00\x08" or raw[3] == 0:
        raise DataFormatError(
            f"{path}: not an IDX file of unsigned bytes (magic number "
            f"{raw[:4].hex() or 'missing'}, expected 00000801 for labels or 00000803 for images). "
            "Download it again.")
    if ndim is not None and raw[3] != ndim:
        raise DataFormatError(f"{path}: IDX file with {raw[3]} dimensions, expected {ndim}.")
    header = 4 + 4 * raw[3]
    if len(raw) < header:
        raise DataFormatError(f"{path}: truncated IDX header. Download the file again.")
    dims = struct.unpack(f">{raw[3]}I", raw[4:header])
    expected, found = int(np.prod(dims, dtype=np.int64)), len(raw) - header
    if expected != found:
        raise DataFormatError(
            f"{path}: the IDX header declares shape {dims} ({expected} bytes of data) but the file "
            f"holds {found}; it is {'truncated' if found < expected else 'corrupt'}. "
            "Download it again.")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def find_idx(folder, stem):
    for variant in (stem, stem.replace("-idx", ".idx")):
        for candidate in (folder / (variant + ".gz"), folder / variant):
            if candidate.is_file():
                return candidate
    return None


def load_npz(name, path):
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: np.asarray(f[k]) for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile) as e:
        raise DataFormatError(f"{path}: not a readable Keras mnist.npz with x_train, y_train, "
                              f"x_test, y_test ({e}). Download it again.") from e
    for k in ("x_train", "x_test"):
        if arrays[k].dtype != np.uint8:
            raise DataFormatError(f"{path}: {k} has dtype {arrays[k].dtype}, expected uint8.")
    train = check_arrays(name, arrays["x_train"], arrays["y_train"], path, path, (28, 28))
    test = check_arrays(name, arrays["x_test"], arrays["y_test"], path, path, (28, 28))
    return (train[0][..., None], train[1]), (test[0][..., None], test[1]), f"npz:{path}"


def check_arrays(name, images, labels, images_path, labels_path, image_shape):
    """Validates shapes, counts and label range; returns (images, int64 labels)."""
    if tuple(images.shape[1:]) != tuple(image_shape):
        raise DataFormatError(f"{images_path}: images of shape {tuple(images.shape[1:])}, "
                              f"expected {tuple(image_shape)} for {TITLES[name]}.")
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(images):
        raise DataFormatError(f"{labels_path}: {labels.shape} labels for {len(images)} images in "
                              f"{images_path}; the counts must match.")
    if labels.size and (not np.issubdtype(labels.dtype, np.integer) or labels.min() < 0
                        or labels.max() >= 10):
        raise DataFormatError(f"{labels_path}: labels must be integers in [0, 10), found "
                              f"{labels.dtype} values in [{labels.min()}, {labels.max()}].")
    other = {"mnist": "fashion_mnist", "fashion_mnist": "mnist"}.get(name)
    if other and len(labels) == 60000 and tuple(labels[:10]) == _FINGERPRINTS[other]:
        raise DataFormatError(f"{labels_path}: these are the {TITLES[other]} files, not "
                              f"{TITLES[name]}; point data_dir at the {TITLES[name]} folder.")
    return images, labels.astype(np.int64)


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR-10 batch holds (a dict of NumPy arrays, lists, bytes)."""

    _ALLOWED = {("_codecs", "encode"), ("numpy", "ndarray"), ("numpy", "dtype")} | {
        (f"numpy.{core}.{mod}", fn) for core in ("core", "_core")
        for mod, fn in (("multiarray", "_reconstruct"), ("multiarray", "scalar"),
                        ("numeric", "_frombuffer"))}

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR-10 batch")


def _read_cifar_batch(raw, where):
    try:
        batch = _CifarUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as e:  # pylint: disable=broad-except  (any unpickling failure)
        raise DataFormatError(f"{where}: not a readable CIFAR-10 python batch "
                              f"({type(e).__name__}: {e}). Download the data again.") from e
    if not isinstance(batch, dict):
        raise DataFormatError(f"{where}: expected a pickled dict, found {type(batch).__name__}.")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise DataFormatError(f"{where}: missing the 'data' or 'labels' entry (keys: "
                              f"{sorted(batch)}).")
    data = batch["data"]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3072:
        raise DataFormatError(f"{where}: 'data' must be a uint8 array of shape [n, 3072], found "
                              f"{getattr(data, 'dtype', type(data).__name__)} "
                              f"{getattr(data, 'shape', '')}.")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return check_arrays("cifar10", images, batch["labels"], where, where, (32, 32, 3))


def load_cifar_local(path):
    tars = [path] if path.is_file() else [path / t for t in CIFAR_TARS]
    folders = [path / CIFAR_DIR, path] if path.is_dir() else []
    for folder in folders:
        present = [(folder / b).is_file() for b in CIFAR_BATCHES]
        if all(present):
            batches = {b: _read_cifar_batch((folder / b).read_bytes(), folder / b)
                       for b in CIFAR_BATCHES}
            return _join_cifar(batches) + (f"cifar-python:{folder}",)
        if any(present):
            missing = [b for b, p in zip(CIFAR_BATCHES, present) if not p]
            raise DataFormatError(f"{folder}: incomplete CIFAR-10 folder, missing "
                                  f"{', '.join(missing)}.")
    for tar in tars:
        if tar.is_file():
            return _load_cifar_tar(tar) + (f"cifar-python:{tar}",)
    if not path.exists():
        return "no such folder"
    return f"no {CIFAR_DIR}/ folder or {CIFAR_TARS[0]}"


def _load_cifar_tar(tar_path):
    raws = {}
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in CIFAR_BATCHES:
                    raws[base] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DataFormatError(f"{tar_path}: corrupt or truncated tarball ({type(e).__name__}: "
                              f"{e}). Download it again.") from e
    missing = [b for b in CIFAR_BATCHES if b not in raws]
    if missing:
        raise DataFormatError(f"{tar_path}: the tarball lacks {', '.join(missing)}; expected "
                              f"the CIFAR-10 python version ({CIFAR_TARS[0]}).")
    return _join_cifar({b: _read_cifar_batch(raw, f"{tar_path}:{b}") for b, raw in raws.items()})


def _join_cifar(batches):
    train = [batches[b] for b in CIFAR_BATCHES[:5]]
    return ((np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
            batches["test_batch"])
