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
"""Tests for tf_tempered.data: real IDX files, tiny written files, corrupt files, TFDS, digits."""

import gzip
import os
import pickle
import re
import struct
import tarfile

import numpy as np
import pytest

from tf_tempered import data

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

MNIST_TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]
IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
       "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@pytest.fixture
def no_local(monkeypatch, tmp_path):
    """No env var and no known locations (they point at an empty temp folder)."""
    monkeypatch.delenv(data.DATA_DIR_ENV, raising=False)
    empty = tmp_path / "nowhere"
    monkeypatch.setattr(data, "KNOWN_LOCATIONS", {k: (str(empty),) for k in data.KNOWN_LOCATIONS})
    return empty


def idx_bytes(array):
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 8, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx_set(folder, n_train=5, n_test=3, compress=True, seed=0):
    """Writes the four IDX files; returns (x_train, y_train, x_test, y_test) as uint8."""
    rng = np.random.default_rng(seed)
    arrays = (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train),
              rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test))
    folder.mkdir(parents=True, exist_ok=True)
    for stem, array in zip(IDX, arrays):
        raw = idx_bytes(array)
        if compress:
            (folder / (stem + ".gz")).write_bytes(gzip.compress(raw))
        else:
            (folder / stem).write_bytes(raw)
    return tuple(np.asarray(a, np.uint8) for a in arrays)


# --- real files in ../shared/data ---------------------------------------------------------

def test_real_mnist(shared_data_dir, no_local):
    ds = data.load("mnist", data_dir=shared_data_dir, allow_tfds=False)
    assert ds.x_train.shape == (60000, 28, 28, 1) and ds.x_test.shape == (10000, 28, 28, 1)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert ds.x_train.min() == 0.0 and ds.x_train.max() == 1.0 and ds.x_test.max() == 1.0
    assert np.bincount(ds.y_train).tolist() == MNIST_TRAIN_COUNTS
    assert np.bincount(ds.y_test).tolist() == MNIST_TEST_COUNTS
    assert ds.y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
    assert ds.source == f"idx:{shared_data_dir / 'mnist'}"
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10
    # Pixel values are k / 255 exactly.
    np.testing.assert_array_equal(np.round(ds.x_test * 255) / np.float32(255), ds.x_test)


def test_real_fashion_mnist(shared_data_dir, no_local):
    ds = data.load("fashion-mnist", data_dir=shared_data_dir / "fashion-mnist", num_test=500,
                   allow_tfds=False)
    assert ds.name == "fashion_mnist" and ds.x_train.shape == (60000, 28, 28, 1)
    assert ds.x_test.shape == (500, 28, 28, 1) and ds.y_test.shape == (500,)
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert ds.y_train[:5].tolist() == [9, 0, 0, 3, 0] and ds.class_names[9] == "Ankle boot"
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() == 1.0


def test_mnist_files_are_not_fashion_mnist(shared_data_dir, no_local):
    with pytest.raises(data.DataFormatError, match="these are the MNIST files, not Fashion-MNIST"):
        data.load("fashion_mnist", data_dir=shared_data_dir / "mnist", allow_tfds=False)


# --- tiny IDX files --------------------------------------------------------------------

@pytest.mark.parametrize("compress", [True, False])
@pytest.mark.parametrize("sub", ["", "mnist"])
def test_idx_round_trip(tmp_path, no_local, compress, sub):
    x_train, y_train, x_test, y_test = write_idx_set(tmp_path / sub, compress=compress)
    (xtr, ytr), (xte, yte) = data.load("mnist", data_dir=tmp_path, allow_tfds=False)
    np.testing.assert_array_equal(xtr, x_train[..., None].astype(np.float32) / np.float32(255))
    np.testing.assert_array_equal(np.round(xte[..., 0] * 255).astype(np.uint8), x_test)
    assert ytr.tolist() == y_train.tolist() and yte.tolist() == y_test.tolist()
    assert ytr.dtype == np.int64 and xtr.shape == (5, 28, 28, 1) and xte.shape == (3, 28, 28, 1)
    np.testing.assert_array_equal(
        data.read_idx(tmp_path / sub / (IDX[0] + (".gz" if compress else ""))), x_train)


def test_limits_and_subfolder_names(tmp_path, no_local):
    x_train, y_train, _, y_test = write_idx_set(tmp_path / "fashion_mnist", n_train=6)
    ds = data.load("fmnist", data_dir=tmp_path, num_train=4, num_test=0, allow_tfds=False)
    assert ds.x_train.shape == (4, 28, 28, 1) and ds.y_train.tolist() == y_train[:4].tolist()
    assert ds.x_test.shape == (0, 28, 28, 1) and ds.y_test.shape == (0,)
    assert ds.source == f"idx:{tmp_path / 'fashion_mnist'}"
    assert repr(ds).startswith("Dataset(name='fashion_mnist', train=4, test=0")


def test_env_var_subfolder_is_used_but_not_its_root(tmp_path, no_local, monkeypatch):
    write_idx_set(tmp_path / "root" / "mnist")
    write_idx_set(tmp_path / "bare")  # bare IDX files: MNIST or Fashion-MNIST? Not guessed.
    monkeypatch.setenv(data.DATA_DIR_ENV, f"{tmp_path / 'bare'}{os.pathsep}{tmp_path / 'root'}")
    assert data.load("mnist", allow_tfds=False).source == f"idx:{tmp_path / 'root' / 'mnist'}"
    with pytest.raises(data.DataNotFoundError):
        data.load("fashion_mnist", allow_tfds=False)


def test_keras_npz_and_dotted_idx_names(tmp_path, no_local):
    x_train, y_train, x_test, y_test = write_idx_set(tmp_path / "idx", compress=False)
    for path in (tmp_path / "idx").iterdir():  # the names some unzip tools produce
        path.rename(path.with_name(path.name.replace("-idx", ".idx")))
    assert data.load("mnist", data_dir=tmp_path / "idx", allow_tfds=False).y_test.tolist() \
        == y_test.tolist()
    np.savez(tmp_path / "mnist.npz", x_train=x_train, y_train=y_train, x_test=x_test,
             y_test=y_test)
    ds = data.load("mnist", data_dir=tmp_path, allow_tfds=False)
    assert ds.source == f"npz:{tmp_path / 'mnist.npz'}" and ds.y_train.tolist() == y_train.tolist()
    np.testing.assert_array_equal(np.round(ds.x_test[..., 0] * 255).astype(np.uint8), x_test)
    (tmp_path / "mnist.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(data.DataFormatError, match=re.escape(str(tmp_path / "mnist.npz"))):
        data.load("mnist", data_dir=tmp_path, allow_tfds=False)


def _corrupt_cases():
    good_images = idx_bytes(np.zeros((5, 28, 28)))
    bad_gzip = "corrupt or truncated gzip"
    return {
        "truncated gzip": (IDX[0] + ".gz", gzip.compress(good_images)[:-20], bad_gzip),
        "bad gzip crc": (IDX[0] + ".gz", _flip_crc(gzip.compress(good_images)), bad_gzip),
        "truncated body": (IDX[0], good_images[:-7], r"declares shape \(5, 28, 28\).*truncated"),
        "trailing bytes": (IDX[0], good_images + b"\0", "corrupt"),
        "bad magic": (IDX[0], b"\x00\x00\x0d\x03" + good_images[4:], "magic number 00000d03"),
        "empty": (IDX[0], b"", "magic number missing"),
        "labels as images": (IDX[0], idx_bytes(np.zeros(5)), "1 dimensions, expected 3"),
        "wrong image size": (IDX[0], idx_bytes(np.zeros((5, 27, 28))), r"expected \(28, 28\)"),
        "count mismatch": (IDX[1], idx_bytes(np.zeros(4)), "counts must match"),
        "label out of range": (IDX[1], idx_bytes([0, 1, 2, 10, 3]),
                               r"labels must be integers in \[0, 10\)"),
    }


def _flip_crc(blob):
    return blob[:-8] + bytes([blob[-8] ^ 0xFF]) + blob[-7:]


@pytest.mark.parametrize("case", sorted(_corrupt_cases()))
def test_corrupt_idx_names_the_file(tmp_path, no_local, case):
    write_idx_set(tmp_path, compress=False)
    file_name, content, message = _corrupt_cases()[case]
    for stem in IDX:  # the corrupt file replaces its good twin
        if file_name.startswith(stem):
            (tmp_path / stem).unlink()
    (tmp_path / file_name).write_bytes(content)
    with pytest.raises(data.DataFormatError, match=message) as info:
        data.load("mnist", data_dir=tmp_path, allow_tfds=False)
    assert str(tmp_path / file_name) in str(info.value)


def test_incomplete_idx_folder(tmp_path, no_local):
    write_idx_set(tmp_path)
    (tmp_path / (IDX[3] + ".gz")).unlink()
    with pytest.raises(data.DataFormatError, match="incomplete MNIST folder, missing t10k-labels"):
        data.load("mnist", data_dir=tmp_path, allow_tfds=False)


# --- CIFAR-10 python-version files -------------------------------------------------------

def write_cifar(folder, sizes=(2, 3, 1, 2, 2, 3), seed=1):
    """Writes cifar-10-batches-py/ in the real layout; returns [(data, labels)] per batch."""
    rng = np.random.default_rng(seed)
    batches = []
    out = folder / "cifar-10-batches-py"
    out.mkdir(parents=True)
    for name, n in zip([f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"], sizes):
        flat = rng.integers(0, 256, (n, 3072)).astype(np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        batch = {b"batch_label": name.encode(), b"labels": labels, b"data": flat,
                 b"filenames": [b"img_%d.png" % i for i in range(n)]}
        (out / name).write_bytes(pickle.dumps(batch, protocol=2))
        batches.append((flat, labels))
    meta = {b"label_names": [n.encode() for n in data._CLASS_NAMES["cifar10"]]}
    (out / "batches.meta").write_bytes(pickle.dumps(meta, protocol=2))
    return batches


def _check_cifar(ds, batches):
    flat_train = np.concatenate([b[0] for b in batches[:5]])
    assert ds.x_train.shape == (len(flat_train), 32, 32, 3) and ds.x_test.shape == (3, 32, 32, 3)
    assert ds.y_train.tolist() == sum((b[1] for b in batches[:5]), [])
    assert ds.y_test.tolist() == batches[5][1] and ds.y_train.dtype == np.int64
    for flat, x in ((flat_train, ds.x_train), (batches[5][0], ds.x_test)):
        pixels = np.round(x * 255).astype(np.uint8)
        # Channel-major: value k of row n is channel k // 1024, row (k % 1024) // 32, col k % 32.
        for n, k in [(0, 0), (0, 1), (0, 1024 + 2 * 32 + 3), (1, 2048 + 31 * 32 + 31), (2, 1500)]:
            assert pixels[n, (k % 1024) // 32, k % 32, k // 1024] == flat[n, k]
        np.testing.assert_array_equal(pixels.transpose(0, 3, 1, 2).reshape(len(flat), -1), flat)


def test_cifar_folder(tmp_path, no_local):
    batches = write_cifar(tmp_path)
    ds = data.load("cifar10", data_dir=tmp_path, allow_tfds=False)
    _check_cifar(ds, batches)
    assert ds.source == f"cifar-python:{tmp_path / 'cifar-10-batches-py'}"
    assert ds.x_train.dtype == np.float32 and ds.x_train.max() <= 1.0
    assert ds.class_names[0] == "airplane"
    # data_dir may also be the batches folder itself.
    assert data.load("cifar-10", data_dir=tmp_path / "cifar-10-batches-py",
                     allow_tfds=False).y_test.tolist() == batches[5][1]


def test_cifar_tarball(tmp_path, no_local):
    batches = write_cifar(tmp_path / "src")
    tar_path = tmp_path / "dl" / "cifar-10-python.tar.gz"
    tar_path.parent.mkdir()
    with tarfile.open(tar_path, "w:gz") as tar:
        tar.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    _check_cifar(data.load("cifar10", data_dir=tmp_path / "dl", allow_tfds=False), batches)
    _check_cifar(data.load("cifar10", data_dir=tar_path, allow_tfds=False), batches)
    tar_path.write_bytes(tar_path.read_bytes()[:-300])
    with pytest.raises(data.DataFormatError, match=re.escape(str(tar_path))):
        data.load("cifar10", data_dir=tmp_path / "dl", allow_tfds=False)


@pytest.mark.parametrize("case", ["missing key", "wrong width", "bad label", "not a pickle",
                                  "foreign global", "missing batch"])
def test_corrupt_cifar_names_the_file(tmp_path, no_local, case):
    write_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    batch = {b"labels": [1], b"data": np.zeros((1, 3072), np.uint8)}
    if case == "missing key":
        del batch[b"labels"]
    elif case == "wrong width":
        batch[b"data"] = np.zeros((1, 3073), np.uint8)
    elif case == "bad label":
        batch[b"labels"] = [12]
    content = pickle.dumps(batch, protocol=2)
    if case == "not a pickle":
        content = b"\x80\x02}q"  # truncated
    elif case == "foreign global":
        content = pickle.dumps({b"data": os.getcwd, b"labels": []}, protocol=2)
    path.write_bytes(content)
    if case == "missing batch":
        path.unlink()
    messages = {"missing key": "missing the 'data' or 'labels'",
                "wrong width": r"shape \[n, 3072\]", "bad label": r"\[0, 10\)",
                "not a pickle": "not a readable CIFAR-10",
                "foreign global": r"unexpected object \w+\.getcwd",
                "missing batch": "missing data_batch_3"}
    with pytest.raises(data.DataFormatError, match=messages[case]) as info:
        data.load("cifar10", data_dir=tmp_path, allow_tfds=False)
    assert str(path if case != "missing batch" else path.parent) in str(info.value)


# --- missing data, TFDS -----------------------------------------------------------------

def test_missing_lists_every_place(tmp_path, no_local):
    with pytest.raises(data.DataNotFoundError) as info:
        data.load("fashion_mnist", data_dir=tmp_path, allow_tfds=False)
    message = str(info.value)
    assert isinstance(info.value, FileNotFoundError)
    for expected in [f"{tmp_path / 'fashion-mnist'} (data_dir=", f"{tmp_path} (data_dir=",
                     f"${data.DATA_DIR_ENV}: not set",
                     f"{no_local} (known location): no such folder",
                     "allow_tfds=False", "train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
                     "apt install dataset-fashion-mnist", "tfds.load('fashion_mnist')"]:
        assert expected in message, expected


def test_tfds_failure_is_listed(no_local, monkeypatch):
    tfds = pytest.importorskip("tensorflow_datasets")

    def offline(*args, **kwargs):
        raise ConnectionError("no network\nsecond line")
    monkeypatch.setattr(tfds, "load", offline)
    expected = "tfds.load.'cifar10'.: ConnectionError: no network"
    with pytest.raises(data.DataNotFoundError, match=expected) as info:
        data.load("cifar10")
    assert "second line" not in str(info.value) and "cifar-10-python.tar.gz" in str(info.value)


class _FetchAttempted(Exception):
    """Raised where requests would send an HTTP request: TFDS got as far as the network."""


_TFDS_URLS = {
    "mnist": {f"https://storage.googleapis.com/cvdf-datasets/mnist/{stem}.gz" for stem in IDX},
    "fashion_mnist": {f"http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/{stem}.gz"
                      for stem in IDX},
    "cifar10": {"https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"},
}


@pytest.mark.parametrize("name", sorted(_TFDS_URLS))
def test_tfds_download_path_reaches_the_network(no_local, tmp_path, monkeypatch, name):
    """TFDS's real download code runs (no mocked tfds.load) until it would send a request.

    This is the path a fresh install takes when no local files exist; it failed with
    "No module named 'importlib_resources'" before setup.cfg declared that module.
    """
    import requests  # pylint: disable=import-outside-toplevel  (a tensorflow-datasets dependency)
    import tensorflow_datasets as tfds  # pylint: disable=import-outside-toplevel
    # TFDS reads $TFDS_DATA_DIR once, at import, into constants.DATA_DIR: patch both so
    # nothing lands in ~/tensorflow_datasets whichever test imported TFDS first.
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    monkeypatch.setattr(tfds.core.constants, "DATA_DIR", str(tmp_path / "tfds"))
    sent = []

    def send(self, request, **kwargs):  # requests.adapters.HTTPAdapter.send, the last step
        del self, kwargs
        sent.append(request.url)
        raise _FetchAttempted(request.url)
    monkeypatch.setattr(requests.adapters.HTTPAdapter, "send", send)
    with pytest.raises(data.DataNotFoundError) as info:
        data.load(name)
    assert sent and set(sent) <= _TFDS_URLS[name], sent
    message = str(info.value)
    assert f"tfds.load({name!r}): _FetchAttempted: http" in message, message
    assert "ModuleNotFoundError" not in message
    # TFDS prepared its download under TFDS_DATA_DIR, not the user's ~/tensorflow_datasets.
    assert (tmp_path / "tfds" / "downloads").is_dir()


@pytest.mark.parametrize("name, shape", [("mnist", (28, 28, 1)), ("fashion_mnist", (28, 28, 1)),
                                         ("cifar10", (32, 32, 3))])
def test_tfds_mock(no_local, name, shape):
    tfds = pytest.importorskip("tensorflow_datasets")
    with tfds.testing.mock_data(num_examples=6):
        ds = data.load(name)
    assert ds.source == f"tfds:{name}"
    assert ds.x_train.shape == (6,) + shape and ds.x_test.shape == (6,) + shape
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    assert 0.0 <= ds.x_train.min() and ds.x_train.max() <= 1.0 and ds.x_train.max() > 0.5
    assert set(ds.y_train.tolist()) <= set(range(10)) and ds.y_test.shape == (6,)


# --- digits, arguments ------------------------------------------------------------------

def _is_subsequence(rows, reference):
    it = iter(reference)
    return all(any(np.array_equal(row, ref) for ref in it) for row in rows)


def test_digits_split_is_fixed_and_exact():
    from sklearn.datasets import load_digits
    ds = data.load("digits")
    assert ds.x_train.shape == (1438, 8, 8, 1) and ds.x_test.shape == (359, 8, 8, 1)
    assert ds.y_test[:12].tolist() == [5, 9, 2, 4, 6, 7, 9, 3, 4, 6, 8, 5]
    assert np.bincount(ds.y_test).tolist() == [36, 36, 35, 37, 36, 36, 36, 36, 35, 36]
    assert ds.x_train.dtype == np.float32 and ds.x_train.max() == 1.0 and ds.x_train.min() == 0.0
    again = data.load("digits")
    np.testing.assert_array_equal(again.x_test, ds.x_test)
    np.testing.assert_array_equal(again.y_train, ds.y_train)
    reference = load_digits().images / 16.0
    assert _is_subsequence(ds.x_test[..., 0], reference)
    assert _is_subsequence(ds.x_train[:200, ..., 0], reference)


def test_bad_arguments():
    with pytest.raises(ValueError, match="name='svhn'; expected one of mnist, fashion_mnist"):
        data.load("svhn")
    with pytest.raises(ValueError, match="num_train must be None or a non-negative int"):
        data.load("digits", num_train=-1)
    for bad in (2.5, "5", True):
        with pytest.raises(ValueError, match="num_test"):
            data.load("digits", num_test=bad)
