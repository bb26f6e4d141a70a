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
"""Black-box one-run audit with input canaries (Steinke, Nasr & Jagielski 2023).

m input canaries (by default examples of the training distribution given a wrong
label, :func:`~tf_tempered.audit.canaries.mislabeled_canaries`; or the caller's
own) are each included with probability ½ (secret, from OS entropy). The model
trains once with the DP engine and its Poisson sampler (``fit`` on arrays); only
the final model is seen, and canary i's score is minus its per-example training
loss (the loss DP-SGD clips), higher = "in".

Every canary stays in the training arrays: an excluded one has sample weight 0,
so its loss and gradient are zero and the run is exactly the run without it, with
the same N, q = batch_size / N and normaliser for both outcomes of every canary
(the add/remove neighbours the accountant's ε is about).
"""

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.audit import canaries as canaries_lib
from tf_tempered.audit import one_run_training as training
from tf_tempered.audit.one_run_counts import DEFAULT_DELTA
from tf_tempered.privacy.per_example_loss import per_example_losses
from tf_tempered.privacy.state import get_state

__all__ = ["black_box_one_run", "loss_scores", "split_canaries"]


def split_canaries(x, y, num_canaries, *, num_classes=None, seed=0):
    """((x, y) without the canaries, canary x, canary wrong labels): m random examples of
    (x, y) (``seed``: public) relabelled with a uniformly drawn wrong class."""
    y = np.asarray(y)
    if num_canaries >= len(y):
        raise ValueError(f"num_canaries={num_canaries} must be below the {len(y)} examples: "
                         f"the canaries are taken out of (x, y). Fix: fewer canaries.")
    if num_classes is None:
        num_classes = int(np.max(y)) + 1
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(y))
    chosen, rest = np.sort(order[:num_canaries]), np.sort(order[num_canaries:])
    mislabeled = canaries_lib.mislabeled_canaries(x[chosen], y[chosen], num_classes=num_classes,
                                                  seed=int(rng.integers(2 ** 31)))
    return (x[rest], y[rest]), mislabeled.x, mislabeled.labels.astype(y.dtype)


def loss_scores(model, x, y, batch_size=1024):
    """−ℓ_i: minus each example's training loss under ``model``'s compiled loss."""
    scores = []
    for start in range(0, len(x), batch_size):
        xb, yb = x[start:start + batch_size], y[start:start + batch_size]
        losses, _ = per_example_losses(model, xb, tf.convert_to_tensor(yb),
                                       model(xb, training=False), None)
        scores.append(-np.asarray(losses, np.float64).reshape(-1))
    return np.concatenate(scores)


def black_box_one_run(model_fn, x, y, *, num_canaries, l2_norm_clip, noise_multiplier,
                      batch_size, epochs, canary_x=None, canary_y=None, num_classes=None,
                      optimizer=None, learning_rate=0.1, loss=None, metrics=None,
                      significance=0.05, delta=DEFAULT_DELTA, fprs=(0.001, 0.01), seed=0,
                      log=print):
    """Audits DP-SGD on ``model_fn()`` trained on (x, y) with input canaries; one run.

    Args:
      model_fn: builds a fresh Keras model (compiled or not) at every call.
      x, y: the training data; ``fit`` draws Poisson batches of expected size
        ``batch_size`` from it and the canaries (q = batch_size / (len(x) + m)).
      num_canaries: m; without ``canary_x`` they are m examples taken out of (x, y)
        and mislabelled (``num_classes``: default max(y) + 1).
      canary_x, canary_y: the caller's own m canaries instead (inputs and labels).
      optimizer: any Keras optimizer (default plain SGD with ``learning_rate``).
      loss: the training loss (default: the one model_fn compiled with); metrics: shown.
      significance, delta, fprs: of the bounds and the ROC summary.
      seed: the canary choice and the weight initialisation (never the inclusion, the
        noise or the batches, which stay secret).
      log: where progress lines go (None: silent).

    Returns:
      A :class:`~tf_tempered.audit.one_run_training.OneRunResult` (kind "black_box").
    """
    batch_size = training.check_positive("batch_size", batch_size, integer=True)
    epochs = training.check_positive("epochs", epochs, integer=True)
    if canary_x is None:
        (x, y), canary_x, canary_y = split_canaries(
            x, y, training.check_positive("num_canaries", num_canaries, integer=True),
            num_classes=num_classes, seed=seed)
    elif canary_y is None or not len(canary_x) == len(canary_y) == num_canaries:
        raise ValueError(f"canary_x and canary_y must both hold num_canaries={num_canaries} "
                         f"canaries (the inputs and their labels); got "
                         f"{len(canary_x)} and {None if canary_y is None else len(canary_y)}.")
    included = training.secret_inclusion(len(canary_x))
    keras.utils.set_random_seed(seed)
    model = training.audit_model(model_fn, x, l2_norm_clip=l2_norm_clip,
                                 noise_multiplier=noise_multiplier, delta=delta)
    model.compile(optimizer=optimizer or keras.optimizers.SGD(learning_rate=learning_rate),
                  loss=training.compiled_loss(model, loss), metrics=metrics)
    train_x = np.concatenate([x, canary_x])
    train_y = np.concatenate([np.asarray(y), np.asarray(canary_y).astype(np.asarray(y).dtype)])
    weights = np.concatenate([np.ones(len(x), np.float32), included.astype(np.float32)])
    progress = training.EpochProgress("black-box", epochs, log)
    model.fit(train_x, train_y, sample_weight=weights, batch_size=batch_size,
                        epochs=epochs, verbose=0, callbacks=[progress])
    scores = loss_scores(model, canary_x, np.asarray(canary_y))  # before reading `included`
    settings = dict(l2_norm_clip=float(l2_norm_clip), noise_multiplier=float(noise_multiplier),
                    batch_size=batch_size, epochs=epochs, num_examples=len(train_x),
                    sampling_probability=min(batch_size, len(train_x)) / len(train_x),
                    optimizer=type(model.optimizer).__name__, seed=seed)
    return training.result_of("black_box", model, scores, included,
                              significance=significance, fprs=fprs,
                              steps=get_state(model).steps_taken(), settings=settings,
                              history=progress.history)
