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
"""White-box scores of gradient canaries from the parameter trajectory (NumPy only).

With plain SGD (learning rate η, normaliser n = the expected batch size), the update
of step t along canary u_i is

    Δθ_t·u_i = −η/n·(s_{i,t}·b_i·c + Z_t·u_i + G_t·u_i),   Z_t ~ N(0, σ²C²·I),

where c = min(‖g_i‖, C) is the canary's clipped norm and G_t the examples' clipped
sum. The per-step *signal* y_{i,t} = −Δθ_t·u_i·n/(η·c) is then s_{i,t}·b_i (1 in the
steps that sampled an included canary) + N(0, σ_c²), σ_c = σ·C/c, + the examples'
drift G_t·u_i. Scores (higher = "in"):

* ``"sum"``: Σ_t y_{i,t} = ⟨θ_0 − θ_T, u_i⟩·n/(η·c) (telescoping: the final minus
  the initial parameters);
* ``"likelihood_ratio"`` (default): Σ_t log(1 − q + q·exp((y_{i,t} − ½)/σ̂²)), the log
  likelihood ratio of the Poisson-subsampled Gaussian mechanism, "canary sampled
  with probability q" against "not there", with σ̂ the noise level *observed* in the
  trajectory (:func:`noise_scale`, which also absorbs the drift's spread). When σ̂ ≤ ½
  a canary's steps stand out one by one, and each canary's median step (its own
  drift) is subtracted first; when σ̂ is larger the canaries differ mainly by their
  mean (q per step), which that centring would remove, so y is used as it is.

Any score computed from the trajectory alone (σ̂ and the centring rule included:
neither reads the inclusion) gives a valid one-run bound; scores differ in power.

>>> projections = np.array([[0.0, 0.0], [-0.1, 0.0], [-0.1, 0.02]])   # θ·u_i, 2 steps
>>> y = step_signals(projections, learning_rate=1.0, normalizer=10, clipped_norm=1.0)
>>> y.tolist()
[[1.0, -0.0], [-0.0, -0.2]]
>>> sum_scores(y).tolist()
[1.0, -0.2]
"""

import numpy as np

__all__ = ["SCORES", "step_signals", "sum_scores", "noise_scale", "likelihood_ratio_scores",
           "trajectory_scores"]

SCORES = ("likelihood_ratio", "sum")


def step_signals(projections, *, learning_rate, normalizer, clipped_norm):
    """y[t, i] = −(p[t+1, i] − p[t, i])·n/(η·c) from projections p [T+1, m] = ⟨θ_t, u_i⟩."""
    projections = np.asarray(projections, np.float64)
    if projections.ndim != 2 or projections.shape[0] < 2:
        raise ValueError(f"projections must be [steps + 1, num_canaries] with at least one "
                         f"step, got shape {projections.shape}.")
    return -np.diff(projections, axis=0) * (normalizer / (learning_rate * clipped_norm))


def sum_scores(signals):
    """Σ_t y[t, i]: the projection of the total displacement θ_0 − θ_T (scaled)."""
    return np.sum(signals, axis=0)


# σ̂ at or below which a canary's steps are told apart one by one: centre on each
# canary's median step (its drift) first.
_CENTRE_BELOW = 0.5
_MAD_TO_STD = 1.482602218505602  # 1 / Φ⁻¹(3/4): the MAD of a normal is 0.6745·σ


def noise_scale(signals):
    """σ̂ = 1.4826·median |y − the canary's median y|: the signals' noise, robust to the
    rare canary steps (a fraction q of an included canary's steps).

    >>> round(noise_scale(np.random.default_rng(0).normal(0, 2, (400, 50))), 1)
    2.0
    """
    signals = np.asarray(signals, np.float64)
    return float(_MAD_TO_STD * np.median(np.abs(signals - np.median(signals, axis=0))))


def likelihood_ratio_scores(signals, *, sampling_probability, noise_multiplier=None,
                            center=None):
    """Σ_t log(1 − q + q·exp((y − ½)/σ²)) per canary (see the module doc).

    ``noise_multiplier``: σ in units of the canary's clipped norm (default σ̂ =
    :func:`noise_scale`); ``center``: subtract each canary's median step first
    (default: when σ̂ ≤ ½).

    >>> y = np.array([[1.0, 0.0], [0.0, 0.0]])
    >>> s = likelihood_ratio_scores(y, sampling_probability=0.5, noise_multiplier=1.0)
    >>> bool(s[0] > s[1])
    True
    """
    signals = np.asarray(signals, np.float64)
    q = float(sampling_probability)
    if not 0 < q <= 1:
        raise ValueError(f"sampling_probability must be in (0, 1], got {sampling_probability!r}.")
    observed = noise_scale(signals)
    sigma = observed if noise_multiplier is None else float(noise_multiplier)
    if not sigma > 0:
        raise ValueError(f"the noise scale must be > 0, got {sigma!r} (noise_multiplier="
                         f"{noise_multiplier!r}): without noise the likelihood ratio is "
                         f"degenerate; use score=\"sum\".")
    if center if center is not None else observed <= _CENTRE_BELOW:
        signals = signals - np.median(signals, axis=0)
    exponent = np.log(q) + (signals - 0.5) / sigma ** 2
    log_out = np.log1p(-q) if q < 1 else -np.inf
    return np.sum(np.logaddexp(log_out, exponent), axis=0)


def trajectory_scores(projections, *, score, learning_rate, normalizer, clipped_norm,
                  sampling_probability):
    """The scores named ``score`` ("likelihood_ratio" or "sum") from the projections
    p [T+1, m] = ⟨θ_t, u_i⟩ of a plain-SGD run."""
    if score not in SCORES:
        raise ValueError(f"score must be one of {SCORES}, got {score!r}.")
    signals = step_signals(projections, learning_rate=learning_rate, normalizer=normalizer,
                           clipped_norm=clipped_norm)
    if score == "sum":
        return sum_scores(signals)
    return likelihood_ratio_scores(signals, sampling_probability=sampling_probability)
