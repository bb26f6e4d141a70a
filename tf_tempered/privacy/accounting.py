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
"""Privacy accounting for DP-SGD with dp_accounting: ε from σ, and σ from ε.

One DP-SGD step with Poisson sampling rate ``q = batch_size / num_examples`` and
noise multiplier σ is the DpEvent ``PoissonSampled(q, Gaussian(σ))``; training is
that event self-composed ``steps`` times, and ε at δ is read off an RDP
(``accountant="rdp"``) or PLD (``accountant="pld"``) accountant. The conventions are
TensorFlow Privacy's (``compute_dp_sgd_privacy_lib``):

* ``steps = ceil(epochs · num_examples / batch_size)`` when epochs are given;
* RDP uses dp_accounting's default orders (what ``compute_dp_sgd_privacy_statement``
  uses);
* microbatches of more than one example double the sensitivity, accounted as σ/2.

``sampling="shuffle"`` gives the bound WITHOUT amplification by subsampling: each
example is used once per epoch, so training composes ``ceil(epochs)`` Gaussian
mechanisms of noise σ. It is much larger than the Poisson ε, and is the honest
figure for ordinary shuffled fixed-size batches.
"""

import math
import numbers
import warnings

import dp_accounting

__all__ = [
    "make_accountant",
    "SAMPLINGS",
    "ACCOUNTANTS",
    "DEFAULT_SAMPLING",
    "DEFAULT_ACCOUNTANT",
    "DEFAULT_DELTA",
    "SHUFFLE_NOTE",
    "num_steps",
    "warn_if_weak_delta",
    "make_dp_event",
    "compute_epsilon",
    "noise_multiplier_for_epsilon",
    "check_prior_events",
    "prior_epsilon",
]

SAMPLINGS = ("poisson", "shuffle")
ACCOUNTANTS = ("rdp", "pld")
# Poisson: the only sampling whose ε has amplification by subsampling. RDP: the accountant
# TF Privacy's compute_dp_sgd_privacy reports, so numbers compare with the paper's.
DEFAULT_SAMPLING = "poisson"
DEFAULT_ACCOUNTANT = "rdp"
# δ of the experiment scripts, the audit and the examples (the paper's): below 1/N for
# every dataset they use (1/60000 for MNIST). compute_epsilon itself has no default δ.
DEFAULT_DELTA = 1e-5
SHUFFLE_NOTE = (
    "sampling='shuffle': epsilon WITHOUT privacy amplification by subsampling "
    "(each example is used once per epoch, so this composes one Gaussian mechanism "
    "per epoch); it is a valid but loose bound for shuffled fixed-size batches. "
    "Train with Poisson sampling (tf_tempered.privacy.sampling.poisson_batches) to "
    "claim the amplified sampling='poisson' epsilon.")


def _check_positive(name, value, *, integer=False):
    ok_type = isinstance(value, numbers.Integral if integer else numbers.Real)
    if isinstance(value, bool) or not ok_type or not value > 0 or not math.isfinite(value):
        kind = "positive integer" if integer else "positive finite number"
        raise ValueError(f"{name} must be a {kind}, got {value!r}; pass e.g. "
                         f"{name}=1{'' if integer else '.0'} or larger.")


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}.")


def num_steps(*, num_examples, batch_size, epochs=None, steps=None):
    """Number of DP-SGD steps: ``ceil(epochs · num_examples / batch_size)``, or ``steps``.

    Exactly one of ``epochs`` and ``steps`` must be given. The rounding is TensorFlow
    Privacy's (``compute_dp_sgd_privacy``): a partial last step counts as a step.

    >>> num_steps(num_examples=60000, batch_size=256, epochs=60)
    14063
    >>> num_steps(num_examples=60000, batch_size=256, steps=100)
    100
    """
    _check_positive("num_examples", num_examples, integer=True)
    _check_positive("batch_size", batch_size)
    if batch_size > num_examples:
        raise ValueError(f"batch_size={batch_size!r} is larger than num_examples="
                         f"{num_examples!r}; use a batch_size of at most num_examples.")
    if (epochs is None) == (steps is None):
        raise ValueError(f"Give exactly one of epochs and steps (got epochs={epochs!r}, "
                         f"steps={steps!r}); e.g. epochs=60 or steps=14063.")
    if steps is not None:
        _check_positive("steps", steps, integer=True)
        return int(steps)
    _check_positive("epochs", epochs)
    return int(math.ceil(epochs * num_examples / batch_size))


def _validate(*, num_examples, batch_size, noise_multiplier, epochs, steps, delta,
              sampling, accountant, microbatch_size, check_noise=True):
    """Checks the arguments; returns the number of steps."""
    count = num_steps(num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                      steps=steps)
    if check_noise:
        _check_positive("noise_multiplier", noise_multiplier)
    _check_positive("microbatch_size", microbatch_size, integer=True)
    if microbatch_size > batch_size:
        raise ValueError(f"microbatch_size={microbatch_size!r} is larger than batch_size="
                         f"{batch_size!r}; use a microbatch_size of at most batch_size.")
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}; pass e.g. delta=1e-5 "
                         f"(well below 1/num_examples).")
    _check_choice("sampling", sampling, SAMPLINGS)
    _check_choice("accountant", accountant, ACCOUNTANTS)
    warn_if_weak_delta(delta, num_examples, stacklevel=4)
    if sampling == "shuffle":
        warnings.warn(SHUFFLE_NOTE, UserWarning, stacklevel=3)
    return count


def warn_if_weak_delta(delta, num_examples, *, stacklevel=2):
    """Warns when δ ≥ 1/N: such an (ε, δ) guarantee allows publishing examples in the clear."""
    if num_examples and delta >= 1.0 / num_examples:
        warnings.warn(
            f"delta={delta!r} >= 1/num_examples={1.0 / num_examples:.3g}: an (ε, δ) "
            f"guarantee with such a δ is weak (a mechanism that publishes a few examples "
            f"in the clear satisfies it); use delta < 1/num_examples, e.g. "
            f"{10 ** math.floor(math.log10(0.1 / num_examples)):.0e}.", UserWarning,
            stacklevel=stacklevel + 1)


def make_dp_event(*, num_examples, batch_size, noise_multiplier, epochs=None, steps=None,
                  sampling=DEFAULT_SAMPLING, microbatch_size=1, prior_events=()):
    """The dp_accounting DpEvent of a DP-SGD run (no validation of δ; see compute_epsilon).

    ``prior_events``: releases computed on the same training data before training (e.g.
    DP feature statistics, :mod:`tf_tempered.feature_stats`); the result then composes
    them with DP-SGD's event: ``Composed([*prior_events, dp_sgd])``.

    Poisson: ``SelfComposed(PoissonSampled(q, Gaussian(σ')), steps)`` with
    ``q = batch_size / num_examples``; shuffle: ``SelfComposed(Gaussian(σ'), passes)``
    with ``passes = ceil(epochs)`` or ``ceil(steps / max(1, ⌊num_examples / batch_size⌋))``:
    a pass of batches that drop the remainder (the train script's, ``shuffled_batches(...,
    drop_remainder=True)``) is ⌊N/B⌋ steps, and each example may be in every pass (at most
    as many as passes of ⌈N/B⌉ steps, or of one unbroken stream, hold).
    ``σ' = σ / 2`` when ``microbatch_size > 1``, else σ.

    >>> make_dp_event(num_examples=100, batch_size=10, noise_multiplier=1.0, steps=5)
    SelfComposedDpEvent(event=PoissonSampledDpEvent(sampling_probability=0.1, \
event=GaussianDpEvent(noise_multiplier=1.0)), count=5)
    """
    count = num_steps(num_examples=num_examples, batch_size=batch_size, epochs=epochs,
                      steps=steps)
    sigma = noise_multiplier / 2.0 if microbatch_size > 1 else noise_multiplier
    event = dp_accounting.GaussianDpEvent(sigma)
    if sampling == "poisson":
        event = dp_accounting.PoissonSampledDpEvent(
            sampling_probability=batch_size / num_examples, event=event)
    elif sampling == "shuffle":
        if epochs is not None:
            count = int(math.ceil(epochs))
        else:  # Passes of ⌊N/B⌋ batches: each example in at most one batch of each.
            count = int(math.ceil(steps / max(1, num_examples // batch_size)))
    else:
        _check_choice("sampling", sampling, SAMPLINGS)
    event = dp_accounting.SelfComposedDpEvent(event=event, count=count)
    prior_events = check_prior_events(prior_events)
    return dp_accounting.ComposedDpEvent([*prior_events, event]) if prior_events else event


def check_prior_events(prior_events):
    """``prior_events`` as a tuple of dp_accounting DpEvents; ValueError naming it otherwise."""
    if isinstance(prior_events, dp_accounting.DpEvent):
        prior_events = (prior_events,)
    try:
        events = tuple(prior_events or ())
    except TypeError:
        events = None
    if events is None or not all(isinstance(e, dp_accounting.DpEvent) for e in events):
        raise ValueError(f"prior_events must be a sequence of dp_accounting DpEvents (releases "
                         f"on the same data before training), got {prior_events!r}.")
    return events


def prior_epsilon(prior_events, *, delta, accountant=DEFAULT_ACCOUNTANT):
    """ε at δ of ``prior_events`` alone (what is spent before the first DP-SGD step)."""
    events = check_prior_events(prior_events)
    if not events:
        return 0.0
    _check_choice("accountant", accountant, ACCOUNTANTS)
    return float(make_accountant(accountant).compose(
        dp_accounting.ComposedDpEvent(list(events))).get_epsilon(delta))


def make_accountant(accountant):
    """A new dp_accounting accountant of the name ``accountant`` ("rdp", else PLD)."""
    if accountant == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    return dp_accounting.pld.PLDAccountant()


def compute_epsilon(*, num_examples, batch_size, noise_multiplier, epochs=None, steps=None,
                    delta, sampling=DEFAULT_SAMPLING, accountant=DEFAULT_ACCOUNTANT,
                    microbatch_size=1, prior_events=()):
    """ε at δ of DP-SGD (add-or-remove-one-example adjacency, all checkpoints released).

    ``sampling="poisson"``: ``steps`` steps of the subsampled Gaussian with
    ``q = batch_size / num_examples``, amplified by subsampling (what
    ``poisson_batches`` trains with). ``sampling="shuffle"``: once-per-epoch bound
    WITHOUT amplification, ``ceil(epochs)`` Gaussian mechanisms of noise σ (a warning
    says so). Give exactly one of ``epochs`` (steps = ceil(epochs·N/B), TF Privacy's
    convention) and ``steps``. A Poisson ``fit(epochs=E)`` takes E·round(N/B) steps
    (:func:`~tf_tempered.privacy.poisson_steps_per_epoch`), which can be more (N = 1438,
    B = 256, E = 5: 30 steps against 29): to plan for exactly that run pass
    ``steps=E * poisson_steps_per_epoch(num_examples=N, expected_batch_size=B)``.
    ``microbatch_size > 1`` doubles the sensitivity (σ/2).
    ``prior_events`` (see :func:`make_dp_event`) are composed in.

    >>> round(compute_epsilon(num_examples=60000, batch_size=256, noise_multiplier=1.1,
    ...                       epochs=60, delta=1e-5), 3)
    2.597
    """
    _validate(num_examples=num_examples, batch_size=batch_size,
              noise_multiplier=noise_multiplier, epochs=epochs, steps=steps, delta=delta,
              sampling=sampling, accountant=accountant, microbatch_size=microbatch_size)
    event = make_dp_event(num_examples=num_examples, batch_size=batch_size,
                          noise_multiplier=noise_multiplier, epochs=epochs, steps=steps,
                          sampling=sampling, microbatch_size=microbatch_size,
                          prior_events=prior_events)
    return float(make_accountant(accountant).compose(event).get_epsilon(delta))


def noise_multiplier_for_epsilon(*, target_epsilon, num_examples, batch_size, epochs=None,
                                 steps=None, delta, sampling=DEFAULT_SAMPLING,
                                 accountant=DEFAULT_ACCOUNTANT, microbatch_size=1,
                                 prior_events=()):
    """Smallest σ with ``compute_epsilon(σ, ...) ≤ target_epsilon`` (dp_accounting calibration).

    With ``prior_events``, σ is calibrated for the budget they leave: the composition of
    them and DP-SGD ends at ``target_epsilon``. ``epochs`` counts steps as
    :func:`compute_epsilon` does; for a Poisson ``fit(epochs=E)`` pass ``steps=E *
    poisson_steps_per_epoch(num_examples=N, expected_batch_size=B)`` instead, the steps that
    fit takes (or attach a ``PrivacyBudget``, which stops before the target is exceeded).

    Uses ``dp_accounting.calibrate_dp_mechanism`` (Brent's method on σ ↦ ε(σ) − target);
    the returned σ satisfies ε(σ) ≤ target_epsilon, with ε(σ) within 1% of it.

    >>> sigma = noise_multiplier_for_epsilon(target_epsilon=3.0, num_examples=60000,
    ...                                      batch_size=256, epochs=60, delta=1e-5)
    >>> round(sigma, 2)
    1.01
    """
    if (isinstance(target_epsilon, bool) or not isinstance(target_epsilon, numbers.Real)
            or not 0 < target_epsilon < math.inf):
        raise ValueError(f"target_epsilon must be a positive finite number, got "
                         f"{target_epsilon!r}; pass e.g. target_epsilon=3.0.")
    _validate(num_examples=num_examples, batch_size=batch_size, noise_multiplier=None,
              epochs=epochs, steps=steps, delta=delta, sampling=sampling,
              accountant=accountant, microbatch_size=microbatch_size, check_noise=False)
    prior_events = check_prior_events(prior_events)
    spent = prior_epsilon(prior_events, delta=delta)
    if spent >= target_epsilon:
        raise ValueError(f"target_epsilon={target_epsilon!r} is already spent before training "
                         f"(prior_events: ε = {spent:.4g}); nothing is left for DP-SGD. Use a "
                         f"larger target_epsilon or less costly prior releases.")

    def make_event(sigma):
        return make_dp_event(num_examples=num_examples, batch_size=batch_size,
                             noise_multiplier=sigma, epochs=epochs, steps=steps,
                             sampling=sampling, microbatch_size=microbatch_size,
                             prior_events=prior_events)

    def calibrate(acc, bracket, rel_tol, scale):
        return dp_accounting.calibrate_dp_mechanism(
            lambda: make_accountant(acc), make_event, target_epsilon, delta,
            bracket_interval=bracket, tol=rel_tol * scale)

    def rdp_epsilon(sigma):
        return make_accountant("rdp").compose(make_event(sigma)).get_epsilon(delta)

    # RDP (fast) first. Bracket: halve σ from 1 until ε(σ) > target, then double.
    lower = 1.0
    while rdp_epsilon(lower) <= target_epsilon:
        lower /= 2.0
        if lower < 1.0 / 64:
            raise ValueError(
                f"target_epsilon={target_epsilon!r} is reached with noise_multiplier <= "
                f"1/64 for this setting; such a large ε gives no meaningful privacy. "
                f"Use a smaller target_epsilon.")
    upper = 2.0 * lower
    while rdp_epsilon(upper) > target_epsilon:
        lower, upper = upper, 2.0 * upper
    # tol is on σ: 1e-5 relative moves ε by far less than 1%.
    sigma = calibrate("rdp", dp_accounting.ExplicitBracketInterval(lower, upper), 1e-5, lower)
    if accountant == "pld":
        # PLD's ε is (up to discretization) a little below RDP's, so its σ is a little
        # smaller; each PLD evaluation is far slower than an RDP one (docs/accounting.md),
        # so bracket tightly and stop at 1e-3 relative tolerance on σ (ε then within ~0.3%
        # of the target).
        try:
            sigma = calibrate("pld", dp_accounting.ExplicitBracketInterval(
                0.85 * sigma, 1.02 * sigma), 1e-3, sigma)
        except ValueError:  # not bracketed: let dp_accounting search from a quarter of it
            sigma = calibrate("pld", dp_accounting.LowerEndpointAndGuess(
                0.25 * sigma, sigma), 1e-3, sigma)
    return float(sigma)
