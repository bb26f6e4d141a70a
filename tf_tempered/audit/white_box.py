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
"""White-box one-run audit of the DP engine with gradient canaries (one training run).

Steinke, Nasr & Jagielski (2023), with Dirac gradient canaries as Nasr et al. (2023):
the auditor inserts m gradient canaries (:mod:`.gradient_canaries`), each included
with probability ½ (secret), each included one joining every DP step with the
Poisson probability q of the examples, and sees every intermediate model. It
scores canary i from the trajectory θ_0, …, θ_T (:mod:`.canary_scores`: the
per-step likelihood ratio, or Σ_t ⟨θ_t − θ_{t+1}, u_i⟩), and the one-run
estimators turn the scores into ε lower bounds. A correct engine keeps them below
the accounted ε (with probability ≥ 1 − significance); an engine that clips or
noises less than it accounts exceeds it.

The model trains with plain SGD (no momentum, constant learning rate η): then the
update along a canary is −η/n times (canary + noise + the examples' gradient) with
n the expected batch size, which the scores undo. The model is the audit's own:
``model_fn`` builds it fresh, and it is discarded after the audit.
"""

from tf_tempered._compat import keras
from tf_tempered.audit import canary_scores
from tf_tempered.audit import one_run_training as training
from tf_tempered.audit.gradient_canaries import CanaryTrajectory, GradientCanaries
from tf_tempered.audit.one_run_counts import DEFAULT_DELTA
from tf_tempered.privacy.state import get_state

__all__ = ["white_box_one_run"]


def white_box_one_run(model_fn, x, y, *, num_canaries, l2_norm_clip, noise_multiplier,
                      batch_size, epochs, learning_rate=0.1, loss=None, metrics=None,
                      canary_kind="dirac", canary_norm=None, score="likelihood_ratio",
                      significance=0.05, delta=DEFAULT_DELTA,
                      fprs=(0.001, 0.01), seed=0, log=print):
    """Audits DP-SGD on ``model_fn()`` trained on (x, y) with gradient canaries; one run.

    Args:
      model_fn: builds a fresh Keras model (compiled or not) at every call.
      x, y: the training arrays; ``fit`` draws Poisson batches of expected size
        ``batch_size`` (q = batch_size / len(x)) for ``epochs`` epochs.
      num_canaries: m (1000 or more for a useful bound).
      l2_norm_clip, noise_multiplier: C and σ given to make_private.
      learning_rate: η of the plain SGD the audit trains with.
      loss: the training loss (default: the one model_fn compiled with); metrics: shown
        in the progress lines.
      canary_kind: "dirac" (one coordinate each) or "random" (unit directions).
      canary_norm: ‖g_i‖ before clipping (default C).
      score: "likelihood_ratio" or "sum" (:mod:`.canary_scores`).
      significance, delta: the bounds hold with probability ≥ 1 − significance, at δ
        (also the δ of the accounted ε).
      seed: the canary directions and the weight initialisation (never the inclusion,
        the noise or the batches, which stay secret).
      log: where progress lines go (None: silent).

    Returns:
      A :class:`~tf_tempered.audit.one_run_training.OneRunResult` (kind "white_box").
    """
    num_canaries = training.check_positive("num_canaries", num_canaries, integer=True)
    batch_size = training.check_positive("batch_size", batch_size, integer=True)
    epochs = training.check_positive("epochs", epochs, integer=True)
    learning_rate = training.check_positive("learning_rate", learning_rate)
    noise_multiplier = training.check_positive("noise_multiplier", noise_multiplier)
    keras.utils.set_random_seed(seed)
    model = training.audit_model(model_fn, x, l2_norm_clip=l2_norm_clip,
                                 noise_multiplier=noise_multiplier, delta=delta)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=learning_rate),
                  loss=training.compiled_loss(model, loss), metrics=metrics)
    q = min(batch_size, len(x)) / len(x)  # what fit's Poisson batches use
    canaries = GradientCanaries(model.trainable_variables, num_canaries=num_canaries,
                                sampling_probability=q, l2_norm_clip=l2_norm_clip,
                                canary_norm=canary_norm, kind=canary_kind, seed=seed)
    canaries.install(model)
    trajectory = CanaryTrajectory(canaries)
    progress = training.EpochProgress("white-box", epochs, log)
    try:
        model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0,
                  callbacks=[trajectory, progress])
    finally:
        get_state(model).audit_hook = None
    projections = trajectory.projections
    # Scored from the trajectory and public settings only; the inclusion is read after.
    scores = canary_scores.trajectory_scores(
        projections, score=score, learning_rate=learning_rate,
        normalizer=min(batch_size, len(x)), clipped_norm=canaries.clipped_norm,
        sampling_probability=q)
    settings = dict(l2_norm_clip=float(l2_norm_clip), noise_multiplier=noise_multiplier,
                    batch_size=batch_size, epochs=epochs, learning_rate=learning_rate,
                    num_examples=len(x), sampling_probability=q, canary_kind=canary_kind,
                    canary_norm=canaries.canary_norm, score=score, seed=seed)
    return training.result_of("white_box", model, scores, canaries.reveal_inclusion(),
                              significance=significance, fprs=fprs,
                              steps=projections.shape[0] - 1, settings=settings,
                              history=progress.history)
