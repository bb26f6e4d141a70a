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
"""One-run audits of DP-SGD on digits, MNIST or Fashion-MNIST (``python -m
tf_tempered.audit one-run``): white-box with gradient canaries, black-box with
mislabelled input canaries, each one training run of a small MLP or CNN.

:func:`run_one_run` trains and audits as :class:`OneRunConfig` says and returns the
:class:`~tf_tempered.audit.one_run_training.OneRunResult` of each audit;
:func:`write_outputs` saves ``one_run_results.json`` and ``one_run_audit.png``.
"""

import dataclasses
import json
import os
import typing

import numpy as np

from tf_tempered import data as data_lib
from tf_tempered import models
from tf_tempered._compat import keras
from tf_tempered.audit import metrics
from tf_tempered.audit.black_box import black_box_one_run
from tf_tempered.audit.one_run_counts import DEFAULT_DELTA
from tf_tempered.audit.white_box import white_box_one_run

__all__ = ["OneRunConfig", "AUDITS", "MODELS", "model_builder", "run_one_run",
           "write_outputs"]

AUDITS = ("both", "white_box", "black_box")
MODELS = ("mlp", "cnn")


@dataclasses.dataclass
class OneRunConfig:
    """Everything that defines a one-run audit (the ``one-run`` command's flags)."""

    dataset: str = "digits"
    data_dir: typing.Optional[str] = None
    num_train: typing.Optional[int] = None   # None: the whole training split
    model: str = "mlp"
    audits: str = "both"
    num_canaries: int = 1000
    epochs: int = 10
    batch_size: int = 64
    learning_rate: float = 0.5
    noise_multiplier: float = 1.0
    l2_norm_clip: float = 1.0
    delta: float = DEFAULT_DELTA
    significance: float = 0.05
    canary_kind: str = "dirac"
    canary_norm: typing.Optional[float] = None
    seed: int = 0


def model_builder(name, input_shape, num_classes):
    """model_fn of a small tanh MLP (one hidden layer of 64) or CNN for the dataset's images.

    The CNN is :func:`tf_tempered.models.mnist_cnn` on 28×28 images, and one 3×3
    convolution of 16 filters below 13×13 (digits' 8×8).
    """
    if name not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {name!r}.")

    def build():
        if name == "cnn" and min(input_shape[:2]) >= 13:
            return models.mnist_cnn("tanh", input_shape=input_shape, num_classes=num_classes)
        body = ([keras.layers.Flatten(), keras.layers.Dense(64, activation="tanh")]
                if name == "mlp" else
                [keras.layers.Conv2D(16, 3, activation="tanh"), keras.layers.Flatten()])
        return keras.Sequential([keras.Input(input_shape), *body,
                                 keras.layers.Dense(num_classes)])
    return build


def _load(config):
    ds = data_lib.load(config.dataset, data_dir=config.data_dir, num_train=config.num_train,
                       num_test=0)
    return ds.x_train, ds.y_train.astype(np.int64), ds.num_classes


def run_one_run(config, *, log=print):
    """Runs the audits ``config.audits`` names; returns their OneRunResults."""
    if config.audits not in AUDITS:
        raise ValueError(f"audits must be one of {AUDITS}, got {config.audits!r}.")
    if config.audits != "black_box" and not config.noise_multiplier > 0:
        # Before any data is loaded (it crashed deep in the white-box audit).
        raise ValueError(
            f"noise_multiplier={config.noise_multiplier!r}: the white-box audit needs noise "
            "(its canary gradients are scored against σ·C). Fix: --noise_multiplier > 0, or "
            "--audits=black_box to audit a run without noise.")
    x, y, num_classes = _load(config)
    model_fn = model_builder(config.model, tuple(x.shape[1:]), num_classes)
    common = dict(num_canaries=config.num_canaries, l2_norm_clip=config.l2_norm_clip,
                  noise_multiplier=config.noise_multiplier, batch_size=config.batch_size,
                  epochs=config.epochs, learning_rate=config.learning_rate,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], significance=config.significance,
                  delta=config.delta, seed=config.seed, log=log)
    results = []
    if config.audits in ("both", "white_box"):
        log(f"White-box one-run audit: {config.num_canaries} {config.canary_kind} gradient "
            f"canaries, {config.model} on {len(y)} {config.dataset} examples ...")
        results.append(white_box_one_run(model_fn, x, y, canary_kind=config.canary_kind,
                                         canary_norm=config.canary_norm, **common))
        log(results[-1].summary())
        keras.backend.clear_session()
    if config.audits in ("both", "black_box"):
        log(f"Black-box one-run audit: {config.num_canaries} mislabelled canaries out of "
            f"{len(y)} {config.dataset} examples, {config.model} ...")
        results.append(black_box_one_run(model_fn, x, y, num_classes=num_classes, **common))
        log(results[-1].summary())
    return results


def write_outputs(config, results, output_dir):
    """Writes ``one_run_results.json`` and ``one_run_audit.png``; returns their paths."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "one_run_results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"config": dataclasses.asdict(config),
                   "audits": [r.to_dict() for r in results]}, f, indent=2)
    return [path, _plot(results, os.path.join(output_dir, "one_run_audit.png"))]


def _plot(results, path):
    """Per audit: the ROC (log-log) and the in/out score histograms."""
    from tf_tempered._plotting import agg_figure  # pylint: disable=g-import-not-at-top
    fig, axes = agg_figure(2, len(results), figsize=(4.5 * len(results), 7))
    for column, result in enumerate(results):
        roc_ax, hist_ax = axes[column], axes[len(results) + column]
        roc = metrics.roc_curve(result.in_scores, result.out_scores)
        floor = 0.5 / max(roc.num_members, roc.num_nonmembers)
        roc_ax.plot(np.maximum(roc.fpr, floor), np.maximum(roc.tpr, floor),
                    label=f"AUC {result.audit.auc:.3f}")
        roc_ax.plot([floor, 1], [floor, 1], ":", color="gray", label="chance")
        roc_ax.set(xscale="log", yscale="log", xlabel="false positive rate",
                   ylabel="true positive rate",
                   title=f"{result.kind}: ε_lb {result.audit.one_run.epsilon:.2f} / "
                         f"{result.audit.one_run_fdp.epsilon:.2f} (f-DP), ε {result.epsilon:.2f}")
        roc_ax.legend(fontsize=8, loc="lower right")
        bins = np.histogram_bin_edges(np.r_[result.in_scores, result.out_scores], bins=40)
        hist_ax.hist(result.out_scores, bins=bins, alpha=0.6, label="canaries out")
        hist_ax.hist(result.in_scores, bins=bins, alpha=0.6, label="canaries in")
        hist_ax.set(xlabel="score (higher = in)", ylabel="canaries")
        hist_ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path
