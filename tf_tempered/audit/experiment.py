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
"""Trains a non-private and a DP-SGD model on a small subset and audits both.

Split of the first ``2N + 2k`` training examples (``N = num_train``,
``k = num_canaries``):

* members and non-members: the first 2N examples, split at random (seeded) into
  two halves of N. Membership must be random over one pool for the ε lower bound
  to mean anything: members from the training split against non-members from the
  test split would also detect the shift between the splits (other writers);
* canaries: the next k images with a random wrong label, trained on;
* controls: the next k images, mislabeled the same way, never trained on.

The models train on members + canaries. The DP model uses Poisson sampling
(``poisson_batches``, q = batch_size / (N + k)), so its accounted ε is
``compute_epsilon(sampling="poisson")`` at ``delta``. Each model is attacked with
the loss and confidence threshold attacks on members vs non-members (and, with
``num_shadow ≥ 2``, LiRA online and offline with shadow models trained the same
way on random halves of members ∪ non-members), and the canaries' exposure is
measured. :func:`run_audit` does it all; :mod:`.report` prints and plots it.
"""

import dataclasses
import json
import math
import os
import typing

import numpy as np

from tf_tempered import data as data_lib
from tf_tempered import models
from tf_tempered._compat import keras
from tf_tempered.audit import attacks, canaries
from tf_tempered.privacy import make_private, optimizers
from tf_tempered.privacy.accounting import DEFAULT_DELTA, compute_epsilon
from tf_tempered.privacy.sampling import poisson_batches, poisson_steps_per_epoch

__all__ = ["AuditConfig", "AuditData", "ModelAudit", "prepare_data", "train_model",
           "predict_logits", "audit_model", "lira_results", "run_audit", "MODEL_NAMES",
           "AUDIT_ONLY_FIELDS"]

MODEL_NAMES = ("non-private", "dp-sgd")
_FILES = {"non-private": "nonprivate.keras", "dp-sgd": "dp.keras"}
CONFIG_FILE = "audit_config.json"
# Settings of the audit itself, not of the trained models: never taken from a saved run.
AUDIT_ONLY_FIELDS = ("num_shadow", "confidence", "delta")


@dataclasses.dataclass
class AuditConfig:
    """Everything that defines an audit run (the command-line flags)."""

    dataset: str = "mnist"
    data_dir: typing.Optional[str] = None
    num_train: int = 1000
    num_canaries: int = 10
    epochs: int = 40
    batch_size: int = 64
    learning_rate: float = 0.25
    noise_multiplier: float = 1.1
    l2_norm_clip: float = 1.0
    delta: float = DEFAULT_DELTA
    activation: str = "tanh"
    num_shadow: int = 0
    confidence: float = 0.95
    # Seeds the split, canaries, shadow-model splits and weight initialisation; the
    # DP noise and Poisson batches are secret unless insecure_dp_seed (NOT private).
    seed: int = 0
    insecure_dp_seed: typing.Optional[int] = None

    def save(self, path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(dataclasses.asdict(self), f, indent=2)

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            return cls(**json.load(f))


@dataclasses.dataclass
class AuditData:
    """Members, non-members, inserted canaries and never-trained control canaries."""

    members: tuple
    nonmembers: tuple
    canaries: canaries.Canaries
    controls: canaries.Canaries
    num_classes: int

    @property
    def train_set(self):
        """(x, y) the models train on: members, then canaries with their secret labels."""
        x, y = self.members
        return (np.concatenate([x, self.canaries.x]),
                np.concatenate([y, self.canaries.labels]))


@dataclasses.dataclass
class ModelAudit:
    """The audit of one model: attacks, canary exposure, accuracy, accounted ε."""

    name: str
    attacks: list
    exposure: canaries.ExposureReport
    control_exposure: canaries.ExposureReport
    epsilon: float
    train_accuracy: float
    heldout_accuracy: float


def prepare_data(config):
    """Loads and splits the dataset as described in the module docstring."""
    n, k = config.num_train, config.num_canaries
    ds = data_lib.load(config.dataset, data_dir=config.data_dir, num_train=2 * n + 2 * k,
                       num_test=0)
    if len(ds.y_train) < 2 * n + 2 * k:
        raise ValueError(
            f"{config.dataset} has {len(ds.y_train)} training examples; num_train={n} "
            f"with num_canaries={k} needs 2·num_train + 2·num_canaries = {2 * n + 2 * k}. "
            f"Use a smaller num_train.")
    x, y = ds.x_train, ds.y_train
    rng = np.random.default_rng(config.seed)
    order = rng.permutation(2 * n)
    members, nonmembers = np.sort(order[:n]), np.sort(order[n:])
    both = canaries.mislabeled_canaries(x[2 * n:], y[2 * n:], num_classes=ds.num_classes,
                                        seed=int(rng.integers(2 ** 31)))

    def part(sl):
        return canaries.Canaries(both.x[sl], both.labels[sl], both.true_labels[sl],
                                 both.num_classes)

    return AuditData(members=(x[members], y[members]),
                     nonmembers=(x[nonmembers], y[nonmembers]),
                     canaries=part(slice(0, k)), controls=part(slice(k, 2 * k)),
                     num_classes=ds.num_classes)


def _loss():
    return keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none")  # per-example losses, both Kerases


def train_model(config, x, y, *, private, num_classes=10, seed=0):
    """Trains the CNN on (x, y); returns (model, accounted ε or inf if not private).

    Non-private: plain SGD with shuffled batches of ``batch_size`` for ``epochs``.
    Private: ``make_private`` + ``DPKerasSGDOptimizer`` on Poisson batches of expected
    size ``batch_size``, ``epochs · round(N / batch_size)`` steps. ``seed`` sets the
    weight initialisation (and the non-private shuffling); the DP noise and batches
    are secret, or derived from ``config.insecure_dp_seed + seed`` if that is set.
    """
    keras.utils.set_random_seed(seed)
    model = models.mnist_cnn(config.activation, input_shape=tuple(x.shape[1:]),
                             num_classes=num_classes)
    if not private:
        model.compile(optimizer=keras.optimizers.SGD(learning_rate=config.learning_rate),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      metrics=["accuracy"])
        model.fit(x, y, batch_size=config.batch_size, epochs=config.epochs, shuffle=True,
                  verbose=0)
        return model, math.inf
    insecure = None if config.insecure_dp_seed is None else config.insecure_dp_seed + seed
    make_private(model, insecure_dp_seed=insecure)
    model.compile(optimizer=optimizers.DPKerasSGDOptimizer(
        l2_norm_clip=config.l2_norm_clip, noise_multiplier=config.noise_multiplier,
        learning_rate=config.learning_rate), loss=_loss(), metrics=["accuracy"])
    steps = config.epochs * poisson_steps_per_epoch(num_examples=len(y),
                                                    expected_batch_size=config.batch_size)
    model.fit(poisson_batches(x, y, expected_batch_size=config.batch_size, steps=steps,
                              insecure_dp_seed=insecure), epochs=1, verbose=0,
              shuffle=False)  # the batches are Poisson-sampled already
    return model, accounted_epsilon(config, len(y), steps)


def accounted_epsilon(config, num_examples, steps):
    """ε at ``config.delta`` of DP-SGD with Poisson sampling (RDP accountant)."""
    if config.noise_multiplier <= 0:
        return math.inf
    return compute_epsilon(num_examples=num_examples, batch_size=config.batch_size,
                           noise_multiplier=config.noise_multiplier, steps=steps,
                           delta=config.delta)


def predict_logits(model, x, batch_size=1024):
    """The model's logits on x as float64 NumPy (eager calls: no retracing per model)."""
    chunks = [np.asarray(model(x[i:i + batch_size], training=False), dtype=np.float64)
              for i in range(0, len(x), batch_size)]
    return np.concatenate(chunks) if chunks else np.zeros((0, model.output_shape[-1]))


def _accuracy(logits, y):
    return float(np.mean(np.argmax(logits, axis=1) == y))


def lira_results(config, data, target_model, *, private):
    """Online and offline LiRA against ``target_model`` with ``config.num_shadow``
    shadow models trained (privately if ``private``) on halves of members ∪ non-members."""
    x_pool = np.concatenate([data.members[0], data.nonmembers[0]])
    y_pool = np.concatenate([data.members[1], data.nonmembers[1]])
    is_member = np.arange(len(y_pool)) < len(data.members[1])

    target = attacks.logit_scaled_confidence(predict_logits(target_model, x_pool), y_pool)

    def train_and_score(keep, seed):
        model, _ = train_model(config, x_pool[keep], y_pool[keep], private=private,
                               num_classes=data.num_classes, seed=seed)
        scores = attacks.logit_scaled_confidence(predict_logits(model, x_pool), y_pool)
        keras.backend.clear_session()
        return scores

    shadow, keep = attacks.shadow_scores(train_and_score, len(y_pool),
                                         num_shadow=config.num_shadow,
                                         seed=config.seed + 1000 * (1 + int(private)))
    kwargs = dict(delta=config.delta, confidence=config.confidence)
    return [attacks.lira_attack(target, shadow, keep, is_member, online=online, **kwargs)
            for online in (True, False)]


def audit_model(name, model, config, data, *, epsilon, lira=False, private=False):
    """Attacks ``model`` (members vs non-members) and measures canary exposure."""
    (xm, ym), (xn, yn) = data.members, data.nonmembers
    member_logits, nonmember_logits = predict_logits(model, xm), predict_logits(model, xn)
    kwargs = dict(delta=config.delta, confidence=config.confidence)
    results = [attacks.loss_attack(member_logits, ym, nonmember_logits, yn, **kwargs),
               attacks.confidence_attack(member_logits, ym, nonmember_logits, yn, **kwargs)]
    if lira:
        results += lira_results(config, data, model, private=private)
    exposure = canaries.canary_exposure(predict_logits(model, data.canaries.x),
                                        data.canaries.labels)
    control = canaries.canary_exposure(predict_logits(model, data.controls.x),
                                       data.controls.labels)
    return ModelAudit(name=name, attacks=results, exposure=exposure, control_exposure=control,
                      epsilon=epsilon, train_accuracy=_accuracy(member_logits, ym),
                      heldout_accuracy=_accuracy(nonmember_logits, yn))


def run_audit(config, *, output_dir=None, model_path=None, log=print):
    """Trains (or loads from ``model_path``) both models, audits them, returns [ModelAudit].

    ``model_path``: a folder written by an earlier run (``nonprivate.keras``,
    ``dp.keras``, ``audit_config.json``); its saved config replaces ``config`` (all
    but :data:`AUDIT_ONLY_FIELDS`) so that the split, canaries, shadow models and
    accounting match the models. Models it lacks are trained. With ``output_dir``,
    the trained models and the config are saved there.
    """
    if model_path is not None:
        saved = os.path.join(model_path, CONFIG_FILE)
        if os.path.exists(saved):
            config = dataclasses.replace(AuditConfig.load(saved), **{
                name: getattr(config, name) for name in AUDIT_ONLY_FIELDS})
            log(f"Loaded the run configuration from {saved}: {config}")
        elif any(os.path.exists(os.path.join(model_path, f)) for f in _FILES.values()):
            # The flags would stand in for how the models were trained: an ε (and a
            # membership split) of a run that never happened.
            raise FileNotFoundError(
                f"--model_path={model_path} holds saved models but not {CONFIG_FILE}, the "
                "configuration they were trained with (σ, epochs, batch size, data split), so "
                "their accounted ε and membership labels cannot be known. Fix: pass the folder "
                "an audit run wrote with --output_dir (it saves that file), or drop "
                "--model_path to train the models again.")
    if config.insecure_dp_seed is not None:
        log(f"NOT PRIVATE: insecure_dp_seed={config.insecure_dp_seed}: the dp-sgd model's "
            f"noise and batches are reproducible, so its accounted ε does not hold.")
    data = prepare_data(config)
    x_train, y_train = data.train_set
    if output_dir:
        os.makedirs(output_dir, exist_ok=True)
        config.save(os.path.join(output_dir, CONFIG_FILE))
    audits = []
    for name in MODEL_NAMES:
        private = name == "dp-sgd"
        path = os.path.join(model_path, _FILES[name]) if model_path else None
        if path and os.path.exists(path):
            log(f"Loading the {name} model from {path}")
            model = keras.models.load_model(path, compile=False)
            epsilon = math.inf
            if private:
                steps = config.epochs * poisson_steps_per_epoch(
                    num_examples=len(y_train), expected_batch_size=config.batch_size)
                epsilon = accounted_epsilon(config, len(y_train), steps)
        else:
            log(f"Training the {name} model on {len(y_train)} examples "
                f"({config.num_canaries} canaries), {config.epochs} epochs ...")
            model, epsilon = train_model(config, x_train, y_train, private=private,
                                         num_classes=data.num_classes, seed=config.seed)
            if output_dir:
                model.save(os.path.join(output_dir, _FILES[name]))
        if config.num_shadow >= 2:
            log(f"Training {config.num_shadow} {name} shadow models for LiRA ...")
        audits.append(audit_model(name, model, config, data, epsilon=epsilon,
                                  lira=config.num_shadow >= 2, private=private))
    return audits
