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
"""Gradient canaries for a white-box one-run audit (Steinke, Nasr & Jagielski 2023).

m canaries u_1, …, u_m are unit vectors in the space of the model's flattened
trainable variables: Dirac canaries (±1 on one coordinate each, distinct
coordinates) or random unit directions. Canary i is *included* with probability ½,
drawn from OS entropy and kept in a variable of this object only (never on the
model, never printed). At every DP step each included canary joins the step like an
example of the data set: with probability q (its own Bernoulli draw per step, the
accountant's Poisson rate), as a gradient g_i = ``canary_norm``·u_i clipped by the
engine's own clip-factor stage, so the step's clipped sum becomes

    Σ_m c_m·g_m + Σ_i b_i·s_{i,t}·c_i·g_i,   b_i ~ Bernoulli(½), s_{i,t} ~ Bernoulli(q),

with c_i = C / max(‖g_i‖, C) from :func:`tf_tempered.privacy.step.clip_factors.clip_factors`
(an engine that does not clip lets a canary with ``canary_norm`` > C in at full
norm, and the audit sees it). The noise and the division by the normaliser follow,
as for the examples. :meth:`GradientCanaries.install` puts the hook in the model's
``PrivateState.audit_hook`` (called by the noise stage before the noise); nothing
else in the engine changes. Only a model an audit trains may carry it: a released
model must never be trained with canaries in its gradient.

:class:`CanaryTrajectory` records ⟨θ_t, u_i⟩ after every step, the white-box view
the scores of :mod:`.canary_scores` are computed from.
"""

import secrets

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step import clip_factors as clip_factor_stage

__all__ = ["CANARY_KINDS", "GradientCanaries", "CanaryTrajectory", "flat_values"]

CANARY_KINDS = ("dirac", "random")
# Dense random directions take m·d floats: refused beyond this (use Dirac canaries).
_MAX_RANDOM_FLOATS = 50_000_000


class _Norms:
    """What clip_factors reads off a layer: ``.result.sq_norms`` [m]."""

    def __init__(self, sq_norms):
        self.result = self
        self.sq_norms = sq_norms


def flat_values(variables):
    """The variables' values, flattened and concatenated, as one float64 NumPy vector."""
    return np.concatenate([np.asarray(keras.ops.convert_to_numpy(v) if hasattr(keras, "ops")
                                      else v.numpy(), np.float64).ravel() for v in variables])


class GradientCanaries:
    """m gradient canaries over ``variables`` with a secret inclusion vector.

    Args:
      variables: the model's trainable variables (their order defines the flat space).
      num_canaries: m; Dirac canaries need m ≤ the number of trainable coordinates.
      sampling_probability: q, the per-step probability an included canary joins a step.
      l2_norm_clip: C, the clip norm of the model's DP settings.
      canary_norm: ‖g_i‖ before clipping (default C: clipping leaves it unchanged).
      kind: "dirac" or "random".
      seed: seeds the canary directions only (public); inclusion and per-step draws
        are always secret.
    """

    def __init__(self, variables, *, num_canaries, sampling_probability, l2_norm_clip,
                 canary_norm=None, kind="dirac", seed=0):
        self.variables = list(variables)
        self.sizes = [int(np.prod(v.shape)) for v in self.variables]
        dim = sum(self.sizes)
        self.num_canaries = _check_num_canaries(num_canaries, kind, dim)
        if not 0 < sampling_probability <= 1:
            raise ValueError(f"sampling_probability must be in (0, 1], got "
                             f"{sampling_probability!r}; the Poisson rate batch_size / N.")
        self.sampling_probability = float(sampling_probability)
        self.l2_norm_clip = float(l2_norm_clip)
        self.canary_norm = float(l2_norm_clip if canary_norm is None else canary_norm)
        if not self.canary_norm > 0:
            raise ValueError(f"canary_norm must be > 0, got {canary_norm!r}; e.g. the clip "
                             f"norm C (the default).")
        self.kind = kind
        rng = np.random.default_rng(seed)
        if kind == "dirac":
            self.coordinates = np.sort(rng.choice(dim, self.num_canaries, replace=False))
            self.signs = rng.choice([-1.0, 1.0], self.num_canaries)
            self.directions = None
        else:
            directions = rng.standard_normal((self.num_canaries, dim))
            self.directions = directions / np.linalg.norm(directions, axis=1, keepdims=True)
        self._make_secret_variables()

    def _make_secret_variables(self):
        # OS entropy, never a seed: the auditor must not know which canaries are in.
        included = np.frombuffer(secrets.token_bytes(self.num_canaries), np.uint8) & 1
        with tf.init_scope():  # eager, even if created while tracing
            self._included = tf.Variable(included.astype(np.float32), trainable=False,
                                         name="audit_canaries_included")
            self._key = tf.Variable(secrets.randbits(63), dtype=tf.int64, trainable=False,
                                    name="audit_canaries_key")
            if self.kind == "dirac":
                self._index = tf.constant(self.coordinates[:, None], tf.int64)
                self._signs = tf.constant(self.signs, tf.float32)
            else:
                self._directions = tf.constant(self.directions, tf.float32)

    def __repr__(self):  # never the inclusion vector
        return (f"GradientCanaries({self.num_canaries} {self.kind}, "
                f"q={self.sampling_probability:.4g}, canary_norm={self.canary_norm})")

    @property
    def clipped_norm(self):
        """‖c_i·g_i‖ = min(canary_norm, C): what a canary adds when a correct engine clips it."""
        return min(self.canary_norm, self.l2_norm_clip)

    def reveal_inclusion(self):
        """The secret inclusion vector (bool [m]); read it only after the scores are fixed."""
        return self._included.numpy() > 0

    def _flat_contribution(self, counter):
        """Σ_i b_i·s_{i,t}·c_i·g_i as a flat [d] tensor at the step's noise ``counter``."""
        m = self.num_canaries
        seed = tf.stack([self._key.read_value(), tf.cast(counter, tf.int64)])
        sampled = tf.cast(tf.random.stateless_uniform([m], seed=seed, dtype=tf.float32)
                          < self.sampling_probability, tf.float32)
        sq_norms = tf.fill([m], tf.constant(self.canary_norm ** 2, tf.float32))
        # The engine's clip stage, looked up at trace time: the canaries are clipped as
        # the examples are (a broken clip stage shows in the audit).
        _, _, weights = clip_factor_stage.clip_factors([_Norms(sq_norms)], m, self.l2_norm_clip)
        magnitude = self._included * sampled * weights.scale * self.canary_norm
        if self.kind == "dirac":
            return tf.scatter_nd(self._index, magnitude * self._signs, [sum(self.sizes)])
        return tf.linalg.matvec(self._directions, magnitude, transpose_a=True)

    def hook(self, summed, variables, counter):
        """``PrivateState.audit_hook``: ``summed`` with the canaries of this step added."""
        if [keras_bridge.variable_key(v) for v in variables] != [
                keras_bridge.variable_key(v) for v in self.variables]:
            raise ValueError("GradientCanaries were made for other trainable variables than "
                             "the model's. Fix: create them from model.trainable_variables "
                             "after the model is built, and do not change trainability.")
        flat = self._flat_contribution(counter)
        for var, part in zip(variables, tf.split(flat, self.sizes)):
            key = keras_bridge.variable_key(var)
            grad = summed.get(key)
            dtype = grad.dtype if grad is not None else tf.float32
            part = tf.cast(tf.reshape(part, var.shape), dtype)
            summed[key] = part if grad is None else grad + part
        return summed

    def install(self, model):
        """Puts :meth:`hook` in ``model``'s PrivateState (make_private must have run)."""
        state = get_state(model)
        if state is None:
            raise ValueError("install: the model was not prepared by make_private. Fix: "
                             "tf_tempered.make_private(model, l2_norm_clip=..., "
                             "noise_multiplier=...) first.")
        if model.distribute_strategy.num_replicas_in_sync > 1:
            raise ValueError("GradientCanaries support one replica: each replica would add "
                             "the canaries to its share of the sum. Fix: audit without a "
                             "tf.distribute strategy.")
        state.audit_hook = self.hook

    def project(self, flat):
        """⟨θ, u_i⟩ for every canary from the flat parameter vector θ ([m])."""
        if self.kind == "dirac":
            return flat[self.coordinates] * self.signs
        return self.directions @ flat


class CanaryTrajectory(keras.callbacks.Callback):
    """Records ⟨θ_t, u_i⟩ before training and after every batch: ``projections`` [T+1, m]."""

    def __init__(self, canaries):
        super().__init__()
        self.canaries = canaries
        self._rows = []

    def _record(self):
        self._rows.append(self.canaries.project(flat_values(self.canaries.variables)))

    def on_train_begin(self, logs=None):
        if not self._rows:
            self._record()

    def on_train_batch_end(self, batch, logs=None):
        self._record()

    @property
    def projections(self):
        return np.stack(self._rows)


def _check_num_canaries(num_canaries, kind, dim):
    if kind not in CANARY_KINDS:
        raise ValueError(f"canary kind must be one of {CANARY_KINDS}, got {kind!r}.")
    if isinstance(num_canaries, bool) or not isinstance(num_canaries, (int, np.integer)) \
            or num_canaries < 2:
        raise ValueError(f"num_canaries must be an integer ≥ 2, got {num_canaries!r}; "
                         f"e.g. 1000.")
    if kind == "dirac" and num_canaries > dim:
        raise ValueError(f"num_canaries={num_canaries} Dirac canaries need as many distinct "
                         f"coordinates, but the model has {dim} trainable parameters. Fix: "
                         f"fewer canaries, or canary_kind=\"random\".")
    if kind == "random" and num_canaries * dim > _MAX_RANDOM_FLOATS:
        raise ValueError(f"num_canaries={num_canaries} random directions over {dim} "
                         f"parameters need {num_canaries * dim:,} floats (at most "
                         f"{_MAX_RANDOM_FLOATS:,}). Fix: kind=\"dirac\", or fewer canaries.")
    return int(num_canaries)
