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
every place looked. :func:`split_validation` (and :func:`validation_block`,
:func:`without_block`), from :mod:`tf_tempered.validation_split`, hold a block of the
training set out.

>>> ds = load("digits")
>>> ds
Dataset(name='digits', train=1438, test=359, input_shape=(8, 8, 1), num_classes=10,
        source='sklearn.datasets.load_digits')
>>> (x_train, y_train), (x_test, y_test) = ds
>>> x_train.dtype, y_train.dtype, float(x_train.max())
(dtype('float32'), dtype('int64'), 1.0)
"""

import dataclasses
import os
import pathlib

import numpy as np

from tf_tempered import data_readers as readers
# In __all__ because they are this module's API: load() raises DataFormatError for a
# corrupt file, and read_idx reads one of the IDX files load() reads.
from tf_tempered.data_readers import DataFormatError, read_idx
# Also this module's API (they split a Dataset); they live in validation_split.py.
from tf_tempered.validation_split import split_validation, validation_block, without_block

__all__ = ["Dataset", "DataFormatError", "DataNotFoundError", "DATA_DIR_ENV",
           "KNOWN_LOCATIONS", "NAMES", "load", "read_idx", "split_validation",
           "validation_block", "without_block"]

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
_TITLES = readers.TITLES
_IDX_FILES = readers.IDX_FILES
_CIFAR_TARS, _CIFAR_BATCHES = readers.CIFAR_TARS, readers.CIFAR_BATCHES
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
        return readers.load_cifar_local(path)
    if not path.is_dir():
        return "not a folder" if path.exists() else "no such folder"
    if name == "mnist" and (path / "mnist.npz").is_file() \
            and not readers.find_idx(path, _IDX_FILES[0]):
        return readers.load_npz(name, path / "mnist.npz")
    found = [readers.find_idx(path, stem) for stem in _IDX_FILES]
    if not any(found):
        return f"no {_IDX_FILES[0]}[.gz]" + (" or mnist.npz" if name == "mnist" else "")
    if not all(found):
        missing = [s + "[.gz]" for s, f in zip(_IDX_FILES, found) if f is None]
        raise DataFormatError(f"{path}: incomplete {_TITLES[name]} folder, missing "
                              f"{', '.join(missing)}.")
    arrays = [read_idx(f, ndim=3 if i % 2 == 0 else 1) for i, f in enumerate(found)]
    train = readers.check_arrays(name, arrays[0], arrays[1], found[0], found[1], (28, 28))
    test = readers.check_arrays(name, arrays[2], arrays[3], found[2], found[3], (28, 28))
    return (train[0][..., None], train[1]), (test[0][..., None], test[1]), f"idx:{path}"


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
        out.append(readers.check_arrays(name, np.concatenate(xs).astype(np.uint8),
                                        np.concatenate(ys), where, where, shape))
    return out[0], out[1], f"tfds:{name}"
