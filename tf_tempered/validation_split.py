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
"""Validation splits of a :class:`tf_tempered.data.Dataset`: a block of its training set held out.

The held-out block is the last ``validation_size`` examples, or block ``k`` counted from
the start (K-fold cross-validation); no shuffling, so the split is fixed and public.
:mod:`tf_tempered.data` re-exports these functions.
"""

import dataclasses

import numpy as np

__all__ = ["split_validation", "validation_block", "without_block"]


def validation_block(num_examples, validation_size, fold=None):
    """``(start, stop)``: which of ``num_examples`` training examples are held out.

    ``fold=None``: the last ``validation_size``. ``fold=k``: block k of
    ``validation_size`` examples counted from the start, ``[k·size, (k+1)·size)``;
    with ``size = N / K``, folds 0..K−1 are K-fold cross-validation.

    >>> validation_block(60000, 5000), validation_block(60000, 12000, fold=1)
    ((55000, 60000), (12000, 24000))
    """
    n = int(num_examples)
    if isinstance(validation_size, bool) or not isinstance(validation_size, (int, np.integer)) \
            or not 0 < validation_size < n:
        raise ValueError(f"validation_size={validation_size!r} is invalid: it must be an "
                         f"integer in [1, {n - 1}] ({n} training examples).")
    size = int(validation_size)
    if fold is None:
        return n - size, n
    if isinstance(fold, bool) or not isinstance(fold, (int, np.integer)) or fold < 0 \
            or (fold + 1) * size > n:
        raise ValueError(f"fold={fold!r} is invalid: with validation_size={size} and {n} "
                         f"training examples it must be an integer in [0, {n // size - 1}].")
    return int(fold) * size, (int(fold) + 1) * size


def without_block(array, start, stop):
    """``array`` minus rows ``[start, stop)``, in order (a view when one part is empty).

    An array-like with a ``without_rows(start, stop)`` method (e.g.
    :class:`tf_tempered.scatternet.ShiftedFeatures`, which stays on disk) does it itself.
    """
    if hasattr(array, "without_rows"):
        return array.without_rows(start, stop)
    if start == 0:
        return array[stop:]
    if stop >= len(array):
        return array[:start]
    return np.concatenate([array[:start], array[stop:]])


def split_validation(dataset, validation_size, *, fold=None):
    """``(train_dataset, (x_val, y_val))``: a block of ``validation_size`` examples held out.

    By default the LAST ``validation_size``; ``fold=k`` holds out the k-th block from
    the start instead (:func:`validation_block`: K-fold cross-validation). A fixed,
    public split (no shuffling): the training files of MNIST, Fashion-MNIST and
    CIFAR-10, and :func:`tf_tempered.data.load`'s digits split, are not ordered by
    class, so every block is a representative sample. The returned Dataset's train
    arrays are the other examples, in order, the only ones a model trained on it sees.

    >>> from tf_tempered.data import load  # a Dataset to split (data.py imports this module)
    >>> train, (x_val, y_val) = split_validation(load("digits"), 100)
    >>> len(train.y_train), len(y_val)
    (1338, 100)
    >>> train, (x_val, y_val) = split_validation(load("digits"), 479, fold=2)
    >>> len(train.y_train), len(y_val)
    (959, 479)
    """
    try:
        start, stop = validation_block(len(dataset.y_train), validation_size, fold)
    except ValueError as e:
        raise ValueError(f"{e} (training set of {dataset.name})") from None
    train = dataclasses.replace(dataset, x_train=without_block(dataset.x_train, start, stop),
                                y_train=without_block(dataset.y_train, start, stop))
    return train, (dataset.x_train[start:stop], dataset.y_train[start:stop])
