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
"""Canary exposure ("The Secret Sharer", Carlini et al. 2019) for classifiers.

A canary is an image with a random WRONG label (the secret) inserted into the
training set. The candidates are all ``num_classes`` labels, ranked by the model's
loss on (image, label), lowest first; with r the rank of the secret label,

    exposure = log2(num_candidates) − log2(r),

from 0 to log2(num_classes) (3.32 bits for 10 classes). A model that did not
memorize the canary puts the image's real class first, so the secret gets r ≥ 2
and exposure ≤ log2(10/2) = 2.32; exposure log2(10) means the secret label beat
the real one. Comparing inserted canaries with control canaries (made the same
way, never trained on) shows how much of it is memorization. Ties count against
the secret (exposure is never overstated).

>>> canaries = mislabeled_canaries(np.zeros((4, 2)), [0, 1, 2, 3], num_classes=10, seed=0)
>>> bool(np.all(canaries.labels != canaries.true_labels))
True
>>> logits = np.array([[0.0, 5.0, 1.0], [3.0, 0.0, 2.0]])
>>> report = canary_exposure(logits, [1, 2])
>>> report.ranks.tolist(), np.round(report.exposures, 3).tolist()
([1, 2], [1.585, 0.585])
"""

import dataclasses

import numpy as np

from tf_tempered.audit import attacks, metrics

__all__ = ["Canaries", "mislabeled_canaries", "canary_ranks", "ExposureReport",
           "canary_exposure"]


@dataclasses.dataclass(frozen=True)
class Canaries:
    """Canary images ``x`` with their secret (wrong) ``labels`` and the ``true_labels``."""

    x: np.ndarray
    labels: np.ndarray
    true_labels: np.ndarray
    num_classes: int


def mislabeled_canaries(x, y, *, num_classes, seed=0):
    """Gives each example (x, y) a label drawn uniformly from the num_classes − 1 wrong ones."""
    y = np.asarray(y).reshape(-1).astype(np.int64)
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes!r}.")
    if len(x) != y.size:
        raise ValueError(f"x and y must have the same length, got {len(x)} and {y.size}.")
    rng = np.random.default_rng(seed)
    shift = rng.integers(1, num_classes, size=y.size)  # never 0, so never the true label
    return Canaries(x=np.asarray(x), labels=(y + shift) % num_classes, true_labels=y,
                    num_classes=int(num_classes))


def canary_ranks(logits, labels):
    """Rank (1 = lowest loss) of each secret label among all classes, ties counted against it.

    Loss ranks equal logit ranks: loss_c = logsumexp(z) − z_c.

    >>> canary_ranks([[1.0, 1.0, 0.0]], [0]).tolist()
    [2]
    """
    losses = -attacks.log_softmax(np.asarray(logits, dtype=np.float64))
    labels = np.asarray(labels).reshape(-1).astype(np.int64)
    secret = np.take_along_axis(losses, labels[:, None], axis=1)
    not_secret = np.arange(losses.shape[1])[None, :] != labels[:, None]
    return 1 + np.sum((losses <= secret) & not_secret, axis=1)


@dataclasses.dataclass(frozen=True)
class ExposureReport:
    """Per-canary ranks and exposures (bits), with their mean and max."""

    ranks: np.ndarray
    exposures: np.ndarray
    num_candidates: int

    @property
    def mean(self):
        return float(np.mean(self.exposures)) if self.exposures.size else float("nan")

    @property
    def max(self):
        return float(np.max(self.exposures)) if self.exposures.size else float("nan")

    def __str__(self):
        return (f"exposure over {self.exposures.size} canaries (max "
                f"{np.log2(self.num_candidates):.2f} bits): mean {self.mean:.3f}, "
                f"max {self.max:.3f}")


def canary_exposure(logits, labels):
    """Exposure of each canary's secret label from the model's logits on the canary images."""
    logits = np.asarray(logits, dtype=np.float64)
    ranks = canary_ranks(logits, labels)
    num_candidates = int(logits.shape[1])
    return ExposureReport(ranks=ranks, exposures=np.atleast_1d(
        metrics.exposure(ranks, num_candidates)), num_candidates=num_candidates)
