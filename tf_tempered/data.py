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
"""MNIST, Fashion-MNIST, CIFAR-10 and scikit-learn's digits as NumPy arrays.

Images are float32 in [0, 1], NHWC (``[N, 28, 28, 1]``, ``[N, 32, 32, 3]``,
``[N, 8, 8, 1]``); labels are int64 class indices. Files are looked for, in
order, in ``data_dir``, under ``$TF_TEMPERED_DATA_DIR`` and in
:data:`KNOWN_LOCATIONS`; then TensorFlow Datasets is asked (it downloads where
the network allows). Corrupt or truncated files raise :class:`DataFormatError`
naming the file; missing data raises one :class:`DataNotFoundError` listing
every place looked.

>>> ds = load("digits")
>>> ds
Dataset(name='digits', train=1438, test=359, input_shape=(8, 8, 1), num_classes=10,
        source='sklearn.datasets.load_digits')
>>> (x_train, y_train), (x_test, y_test) = ds
>>> x_train.dtype, y_train.dtype, float(x_train.max())
(dtype('float32'), dtype('int64'), 1.0)
"""

import dataclasses
import gzip
import io
import os
import pathlib
import pickle
import struct
import tarfile
import zipfile
import zlib

import numpy as np

__all__ = ["Dataset", "DataFormatError", "DataNotFoundError", "DATA_DIR_ENV",
           "KNOWN_LOCATIONS", "NAMES", "load", "read_idx"]

NAMES = ("mnist", "fashion_mnist", "cifar10", "digits")
DATA_DIR_ENV = "TF_TEMPERED_DATA_DIR"
KNOWN_LOCATIONS = {
    "mnist": ("~/.keras/datasets",),
    "fashion_mnist": ("/usr/share/datasets/fashion-mnist", "~/.keras/datasets/fashion-mnist"),
    "cifar10": ("~/.keras/datasets",),
}
_ALIASES = {"fmnist": "fashion_mnist", "cifar_10": "cifar10"}
_SUBDIRS = {"mnist": ("mnist", "MNIST/raw"),
            "fashion_mnist": ("fashion-mnist", "fashion_mnist", "FashionMNIST/raw"),
            "cifar10": ("cifar10", "cifar-10")}
_TITLES = {"mnist": "MNIST", "fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10"}
_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
              "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_CIFAR_DIR = "cifar-10-batches-py"
_CIFAR_TARS = ("cifar-10-python.tar.gz", "cifar-10-batches-py.tar.gz")  # official, Keras cache
_CIFAR_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
# First ten training labels of the full sets: catches one set's files filed under the other's name.
_FINGERPRINTS = {"mnist": (5, 0, 4, 1, 9, 2, 1, 3, 1, 4),
                 "fashion_mnist": (9, 0, 0, 3, 0, 2, 7, 2, 5, 5)}
_CLASS_NAMES = {
    "mnist": tuple("0123456789"), "digits": tuple("0123456789"),
    "fashion_mnist": ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                      "Sneaker", "Bag", "Ankle boot"),
    "cifar10": ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                "truck"),
}
_DIGITS_TEST_FRACTION, _DIGITS_SEED = 0.2, 0


class DataNotFoundError(FileNotFoundError):
    """No source had the dataset; the message lists every place looked and how to get it."""


class DataFormatError(ValueError):
    """A data file is truncated, corrupt or not in the expected format; the message names it."""


@dataclasses.dataclass(frozen=True, repr=False, eq=False)
class Dataset:
    """Train and test arrays plus metadata; unpacks as ``(x_train, y_train), (x_test, y_test)``."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    class_names: tuple
    source: str

    @property
    def input_shape(self):
        """Shape of one example, e.g. ``(28, 28, 1)``."""
        return tuple(self.x_train.shape[1:])

    @property
    def train(self):
        """``(x_train, y_train)``."""
        return self.x_train, self.y_train

    @property
    def test(self):
        """``(x_test, y_test)``."""
        return self.x_test, self.y_test

    def __iter__(self):
        return iter((self.train, self.test))

    def __repr__(self):
        return (f"Dataset(name={self.name!r}, train={len(self.y_train)}, test={len(self.y_test)}, "
                f"input_shape={self.input_shape}, num_classes={self.num_classes}, "
                f"source={self.source!r})")


def load(name, *, data_dir=None, num_train=None, num_test=None, allow_tfds=True):
    """Loads ``name`` (one of :data:`NAMES`) as a :class:`Dataset`.

    Args:
        name: "mnist", "fashion_mnist" (or "fashion-mnist"), "cifar10" or "digits"
            (built into scikit-learn; ``data_dir`` and ``allow_tfds`` do not apply).
        data_dir: folder holding the standard files (IDX files, the
            ``cifar-10-batches-py`` folder or ``cifar-10-python.tar.gz``), directly or
            in a subfolder named after the dataset (``mnist``, ``fashion-mnist``, ...).
        num_train, num_test: keep only the first so many examples (quick runs).
        allow_tfds: whether to fall back to ``tensorflow_datasets`` (may download).

    >>> load("digits", num_train=100, num_test=10).x_train.shape
    (100, 8, 8, 1)
    """
    key = str(name).lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in NAMES:
        raise ValueError(f"Unknown dataset name={name!r}; expected one of {', '.join(NAMES)}.")
    limits = {}
    for arg, value in (("num_train", num_train), ("num_test", num_test)):
        if value is not None and (isinstance(value, bool)
                                  or not isinstance(value, (int, np.integer)) or value < 0):
            raise ValueError(f"{arg} must be None or a non-negative int, got {value!r}.")
        limits[arg] = None if value is None else int(value)
    if key == "digits":
        (xtr, ytr), (xte, yte), source = *_load_digits(), "sklearn.datasets.load_digits"
    else:
        (xtr, ytr), (xte, yte), source = _find_and_load(key, data_dir, allow_tfds, limits)
    xtr, ytr = xtr[:limits["num_train"]], ytr[:limits["num_train"]]
    xte, yte = xte[:limits["num_test"]], yte[:limits["num_test"]]
    return Dataset(key, _to_float(xtr), ytr.astype(np.int64), _to_float(xte), yte.astype(np.int64),
                   10, _CLASS_NAMES[key], source)


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


def _to_float(images):
    if images.dtype == np.uint8:
        return images.astype(np.float32) / np.float32(255.0)
    return images.astype(np.float32)


def _load_digits():
    """sklearn's 8x8 digits, scaled to [0, 1], split 80/20 per class with a fixed seed."""
    from sklearn.datasets import load_digits  # pylint: disable=g-import-not-at-top
    digits = load_digits()
    images = (digits.images[..., None] / 16.0).astype(np.float32)  # pixel values are 0..16
    labels = digits.target.astype(np.int64)
    rng = np.random.default_rng(_DIGITS_SEED)
    test = np.zeros(len(labels), bool)
    for c in range(10):
        idx = np.flatnonzero(labels == c)
        test[rng.permutation(idx)[:int(round(_DIGITS_TEST_FRACTION * len(idx)))]] = True
    return (images[~test], labels[~test]), (images[test], labels[test])


def _find_and_load(name, data_dir, allow_tfds, limits):
    places, looked = [], []  # places: (label, folder or None if the label says why not)
    if data_dir is not None:
        places += [(f"data_dir={str(data_dir)!r}", p)
                   for p in _candidates(name, pathlib.Path(data_dir).expanduser(), True)]
    env = [e for e in os.environ.get(DATA_DIR_ENV, "").split(os.pathsep) if e]
    places += [(f"${DATA_DIR_ENV}", p) for e in env
               for p in _candidates(name, pathlib.Path(e).expanduser(), False)]
    places += [] if env else [(f"${DATA_DIR_ENV}: not set", None)]
    places += [("known location", pathlib.Path(p).expanduser())
               for p in KNOWN_LOCATIONS.get(name, ())]
    for label, path in places:
        result = "" if path is None else _load_local(name, path)
        if not isinstance(result, str):
            return result
        looked.append(f"{path} ({label}): {result}" if path is not None else label)
    if not allow_tfds:
        looked.append("TensorFlow Datasets: not tried (allow_tfds=False)")
    else:
        try:
            return _load_tfds(name, limits)
        except DataFormatError:
            raise
        except Exception as e:  # pylint: disable=broad-except  (any download/import failure)
            reason = (str(e).splitlines() or [""])[0][:300]
            looked.append(f"TensorFlow Datasets, tfds.load({name!r}): {type(e).__name__}: {reason}")
    lines = "\n".join(f"  - {entry}" for entry in looked)
    raise DataNotFoundError(
        f"Could not find the {_TITLES[name]} data. Looked in:\n{lines}\n{_how_to_get(name)}")


def _candidates(name, root, include_root):
    """Folders to search under ``root``: its dataset-named subfolders, then itself."""
    if not root.is_dir():
        return [root]
    # CIFAR-10's folder and tarball names are unambiguous; bare IDX files are not.
    with_root = include_root or name == "cifar10"
    return [root / s for s in _SUBDIRS[name]] + ([root] if with_root else [])


def _how_to_get(name):
    if name == "cifar10":
        how = ("Get cifar-10-python.tar.gz (the \"python version\") from "
               "https://www.cs.toronto.edu/~kriz/cifar.html and pass data_dir=<its folder> "
               "(it may hold the tarball or the extracted cifar-10-batches-py/ folder with "
               f"{', '.join(_CIFAR_BATCHES)}), or put it in ${DATA_DIR_ENV}/cifar10")
    else:
        how = (f"Put the four IDX files {', '.join(f + '.gz' for f in _IDX_FILES)} "
               "(gzip-compressed or not) in a folder and pass data_dir=<that folder>, or put "
               f"them in ${DATA_DIR_ENV}/{_SUBDIRS[name][0]}")
        if name == "fashion_mnist":
            how += ("; on Debian/Ubuntu `sudo apt install dataset-fashion-mnist` installs them "
                    "in /usr/share/datasets/fashion-mnist")
    return how + ("; or, where the network allows, let TensorFlow Datasets download it: python -c "
                  f"\"import tensorflow_datasets as tfds; tfds.load('{name}')\" (it caches in "
                  "~/tensorflow_datasets or $TFDS_DATA_DIR).")


def _load_local(name, path):
    """Arrays from ``path`` if it holds the dataset, else a short reason (str) why not."""
    if name == "cifar10":
        return _load_cifar_local(path)
    if not path.is_dir():
        return "not a folder" if path.exists() else "no such folder"
    if name == "mnist" and (path / "mnist.npz").is_file() and not _find_idx(path, _IDX_FILES[0]):
        return _load_npz(name, path / "mnist.npz")
    found = [_find_idx(path, stem) for stem in _IDX_FILES]
    if not any(found):
        return f"no {_IDX_FILES[0]}[.gz]" + (" or mnist.npz" if name == "mnist" else "")
    if not all(found):
        missing = [s + "[.gz]" for s, f in zip(_IDX_FILES, found) if f is None]
        raise DataFormatError(f"{path}: incomplete {_TITLES[name]} folder, missing "
                              f"{', '.join(missing)}.")
    arrays = [read_idx(f, ndim=3 if i % 2 == 0 else 1) for i, f in enumerate(found)]
    train = _check(name, arrays[0], arrays[1], found[0], found[1], (28, 28))
    test = _check(name, arrays[2], arrays[3], found[2], found[3], (28, 28))
    return (train[0][..., None], train[1]), (test[0][..., None], test[1]), f"idx:{path}"


def _find_idx(folder, stem):
    for variant in (stem, stem.replace("-idx", ".idx")):
        for candidate in (folder / (variant + ".gz"), folder / variant):
            if candidate.is_file():
                return candidate
    return None


def _load_npz(name, path):
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: np.asarray(f[k]) for k in ("x_train", "y_train", "x_test", "y_test")}
    except (OSError, ValueError, KeyError, EOFError, zlib.error, zipfile.BadZipFile) as e:
        raise DataFormatError(f"{path}: not a readable Keras mnist.npz with x_train, y_train, "
                              f"x_test, y_test ({e}). Download it again.") from e
    for k in ("x_train", "x_test"):
        if arrays[k].dtype != np.uint8:
            raise DataFormatError(f"{path}: {k} has dtype {arrays[k].dtype}, expected uint8.")
    train = _check(name, arrays["x_train"], arrays["y_train"], path, path, (28, 28))
    test = _check(name, arrays["x_test"], arrays["y_test"], path, path, (28, 28))
    return (train[0][..., None], train[1]), (test[0][..., None], test[1]), f"npz:{path}"


def _check(name, images, labels, images_path, labels_path, image_shape):
    """Validates shapes, counts and label range; returns (images, int64 labels)."""
    if tuple(images.shape[1:]) != tuple(image_shape):
        raise DataFormatError(f"{images_path}: images of shape {tuple(images.shape[1:])}, "
                              f"expected {tuple(image_shape)} for {_TITLES[name]}.")
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
        raise DataFormatError(f"{labels_path}: these are the {_TITLES[other]} files, not "
                              f"{_TITLES[name]}; point data_dir at the {_TITLES[name]} folder.")
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
    return _check("cifar10", images, batch["labels"], where, where, (32, 32, 3))


def _load_cifar_local(path):
    tars = [path] if path.is_file() else [path / t for t in _CIFAR_TARS]
    folders = [path / _CIFAR_DIR, path] if path.is_dir() else []
    for folder in folders:
        present = [(folder / b).is_file() for b in _CIFAR_BATCHES]
        if all(present):
            batches = {b: _read_cifar_batch((folder / b).read_bytes(), folder / b)
                       for b in _CIFAR_BATCHES}
            return _join_cifar(batches) + (f"cifar-python:{folder}",)
        if any(present):
            missing = [b for b, p in zip(_CIFAR_BATCHES, present) if not p]
            raise DataFormatError(f"{folder}: incomplete CIFAR-10 folder, missing "
                                  f"{', '.join(missing)}.")
    for tar in tars:
        if tar.is_file():
            return _load_cifar_tar(tar) + (f"cifar-python:{tar}",)
    if not path.exists():
        return "no such folder"
    return f"no {_CIFAR_DIR}/ folder or {_CIFAR_TARS[0]}"


def _load_cifar_tar(tar_path):
    raws = {}
    try:
        with tarfile.open(tar_path, "r:*") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if member.isfile() and base in _CIFAR_BATCHES:
                    raws[base] = tar.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DataFormatError(f"{tar_path}: corrupt or truncated tarball ({type(e).__name__}: "
                              f"{e}). Download it again.") from e
    missing = [b for b in _CIFAR_BATCHES if b not in raws]
    if missing:
        raise DataFormatError(f"{tar_path}: the tarball lacks {', '.join(missing)}; expected "
                              f"the CIFAR-10 python version ({_CIFAR_TARS[0]}).")
    return _join_cifar({b: _read_cifar_batch(raw, f"{tar_path}:{b}") for b, raw in raws.items()})


def _join_cifar(batches):
    train = [batches[b] for b in _CIFAR_BATCHES[:5]]
    return ((np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
            batches["test_batch"])


def _load_tfds(name, limits):
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  (slow import)
    out = []
    for split, limit in (("train", limits["num_train"]), ("test", limits["num_test"])):
        ds = tfds.load(name, split=f"{split}[:{limit}]" if limit else split,
                       as_supervised=True)
        # Batched iteration rather than batch_size=-1, which needs the split size up front.
        xs, ys = [], []
        for x, y in tfds.as_numpy(ds.batch(4096)):
            xs.append(x)
            ys.append(y)
        where = f"tfds.load({name!r}, split={split!r})"
        if not xs:
            raise DataFormatError(f"{where}: returned no examples.")
        shape = (32, 32, 3) if name == "cifar10" else (28, 28, 1)
        out.append(_check(name, np.concatenate(xs).astype(np.uint8), np.concatenate(ys), where,
                          where, shape))
    return out[0], out[1], f"tfds:{name}"
