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
"""Tests for tf_tempered.privacy.accounting against TensorFlow Privacy's own numbers."""

import inspect
import math
import re
import warnings

import dp_accounting
import pytest

from tf_tempered._compat import tensorflow_privacy
from tf_tempered.privacy import accounting
from tf_tempered.privacy.accounting import compute_epsilon, noise_multiplier_for_epsilon

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

# (num_examples, batch_size, noise_multiplier, epochs, delta)
SETTINGS = [
    (60000, 256, 1.1, 60, 1e-5),   # Abadi et al. / TF Privacy MNIST tutorial
    (60000, 256, 1.1, 15, 1e-5),
    (60000, 512, 0.7, 10, 1e-5),
    (50000, 250, 1.5, 30, 1e-5),   # epochs · N / B integral
    (10000, 100, 2.0, 2.5, 1e-6),  # fractional epochs
    (1000, 10, 0.8, 1, 1e-4),
]
# The orders of TF Privacy's (deprecated) compute_dp_sgd_privacy.
LEGACY_ORDERS = ([1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5] + list(range(5, 64))
                 + [128, 256, 512])


if tensorflow_privacy is not None:  # the reference; the tests using it are marked tf_privacy
    from tensorflow_privacy.privacy.analysis import compute_dp_sgd_privacy_lib as tfp_lib


def _tfp_example_epsilon(n, b, sigma, epochs, delta, *, poisson=True, microbatching=False,
                         accountant="RDP"):
    return tfp_lib._compute_dp_sgd_example_privacy(  # pylint: disable=protected-access
        epochs, sigma, delta, used_microbatching=microbatching,
        poisson_subsampling_probability=b / n if poisson else None,
        accountant_type=tfp_lib.AccountantType(accountant))


@pytest.mark.tf_privacy
@pytest.mark.parametrize("n,b,sigma,epochs,delta", SETTINGS)
def test_poisson_rdp_equals_tf_privacy(n, b, sigma, epochs, delta):
    eps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma, epochs=epochs,
                          delta=delta)
    assert eps == pytest.approx(_tfp_example_epsilon(n, b, sigma, epochs, delta), rel=1e-12)
    # Microbatches of more than one example: TF Privacy's used_microbatching=True (σ/2).
    eps_mb = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma,
                             epochs=epochs, delta=delta, microbatch_size=2)
    assert eps_mb == pytest.approx(
        _tfp_example_epsilon(n, b, sigma, epochs, delta, microbatching=True), rel=1e-12)
    assert eps_mb > 1.5 * eps


@pytest.mark.tf_privacy
@pytest.mark.parametrize("n,b,sigma,epochs,delta", SETTINGS[:3])
def test_same_steps_and_event_as_legacy_compute_dp_sgd_privacy(n, b, sigma, epochs, delta):
    # With the legacy orders, our event gives exactly compute_dp_sgd_privacy's ε,
    # which checks the step count ceil(epochs·N/B) and the sampling rate.
    event = accounting.make_dp_event(num_examples=n, batch_size=b, noise_multiplier=sigma,
                                     epochs=epochs)
    assert event.count == math.ceil(epochs * n / b)
    legacy_eps, _ = tfp_lib.compute_dp_sgd_privacy(n, b, sigma, epochs, delta)
    ours = dp_accounting.rdp.RdpAccountant(LEGACY_ORDERS).compose(event).get_epsilon(delta)
    assert ours == pytest.approx(legacy_eps, rel=1e-12)
    # The default orders (TF Privacy's current ones) differ: ε moves by a few percent.
    eps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma, epochs=epochs,
                          delta=delta)
    assert eps == pytest.approx(legacy_eps, rel=3e-2)


@pytest.mark.tf_privacy
def test_matches_printed_privacy_statement():
    n, b, sigma, epochs, delta = SETTINGS[0]
    text = tfp_lib.compute_dp_sgd_privacy_statement(n, b, epochs, sigma, delta,
                                                    used_microbatching=False)
    once = float(re.search(r"once per epoch:\s+([\d.]+)", text).group(1))
    poisson = float(re.search(r"Poisson sampling \(\*\):\s+([\d.]+)", text).group(1))
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        shuffle = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma,
                                  epochs=epochs, delta=delta, sampling="shuffle")
    assert round(shuffle, 3) == once
    assert round(compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma,
                                 epochs=epochs, delta=delta), 3) == poisson
    assert poisson == pytest.approx(2.597, abs=1e-3)


def test_tf_privacy_tutorial_epsilon_without_tf_privacy():
    # TF Privacy's MNIST tutorial setting: its statement prints 2.597 (Poisson sampling).
    # Three decimals only: the last digits belong to dp-accounting's version.
    n, b, sigma, epochs, delta = SETTINGS[0]
    eps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma, epochs=epochs,
                          delta=delta)
    assert eps == pytest.approx(2.597, abs=1e-3)


@pytest.mark.parametrize("epochs", [1, 2.5, 60])
def test_shuffle_composes_one_gaussian_per_epoch(epochs):
    n, b, sigma, delta = 60000, 256, 1.1, 1e-5
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        eps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma,
                              epochs=epochs, delta=delta, sampling="shuffle")
    if tensorflow_privacy is not None:  # the reference, where installed (Python <= 3.11)
        assert eps == pytest.approx(
            _tfp_example_epsilon(n, b, sigma, epochs, delta, poisson=False), rel=1e-12)
    # ceil(epochs) Gaussians of σ compose to one Gaussian of σ/sqrt(ceil(epochs)).
    single = dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.GaussianDpEvent(sigma / math.sqrt(math.ceil(epochs)))).get_epsilon(delta)
    assert eps == pytest.approx(single, rel=1e-9)
    # Same with steps: 1 epoch = 235 steps of 256 (the last partial).
    with pytest.warns(UserWarning):
        by_steps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma,
                                   steps=235 * math.ceil(epochs), delta=delta,
                                   sampling="shuffle")
    assert by_steps >= eps


# Before: ceil(steps·B/N) passes, 3 for 4 steps of 1000 of 1438 examples, though batches
# that drop the remainder make every step a pass there (the train script's own run counted
# 4: ε 4.729 against the CLI's 4.011; probe W, F2).
@pytest.mark.parametrize("n, b, steps, passes", [(1438, 1000, 4, 4), (64, 16, 8, 2),
                                                 (70, 16, 8, 2), (70, 16, 9, 3),
                                                 (16, 16, 3, 3)])
def test_shuffle_steps_count_passes_of_batches_that_drop_the_remainder(n, b, steps, passes):
    with pytest.warns(UserWarning, match="WITHOUT privacy amplification"):
        eps = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=2.0, steps=steps,
                              delta=1e-5, sampling="shuffle")
    gaussians = dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), passes)
    assert eps == pytest.approx(
        dp_accounting.rdp.RdpAccountant().compose(gaussians).get_epsilon(1e-5), rel=1e-12)


def test_steps_and_epochs_agree():
    kwargs = dict(num_examples=60000, batch_size=256, noise_multiplier=1.1, delta=1e-5)
    assert compute_epsilon(epochs=60, **kwargs) == compute_epsilon(steps=14063, **kwargs)
    assert compute_epsilon(steps=14000, **kwargs) < compute_epsilon(steps=14063, **kwargs)


@pytest.mark.parametrize("n,b,sigma,epochs,delta", [SETTINGS[0], SETTINGS[4]])
def test_pld_close_to_and_below_rdp(n, b, sigma, epochs, delta):
    rdp = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma, epochs=epochs,
                          delta=delta)
    pld = compute_epsilon(num_examples=n, batch_size=b, noise_multiplier=sigma, epochs=epochs,
                          delta=delta, accountant="pld")
    if tensorflow_privacy is not None:  # the reference, where installed (Python <= 3.11)
        assert pld == pytest.approx(_tfp_example_epsilon(n, b, sigma, epochs, delta,
                                                         accountant="PLD"), rel=1e-9)
    assert 0.75 * rdp < pld <= 1.001 * rdp


@pytest.mark.parametrize("target,sampling,accountant", [
    (3.0, "poisson", "rdp"), (0.5, "poisson", "rdp"), (8.0, "poisson", "rdp"),
    (2.0, "shuffle", "rdp"), (3.0, "poisson", "pld")])
def test_noise_multiplier_for_epsilon(target, sampling, accountant):
    # PLD composes every step; 5 epochs (1 172 steps) keep the same check fast.
    kwargs = dict(num_examples=60000, batch_size=256, epochs=5 if accountant == "pld" else 60,
                  delta=1e-5, sampling=sampling, accountant=accountant)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the shuffle note
        sigma = noise_multiplier_for_epsilon(target_epsilon=target, **kwargs)
        eps = compute_epsilon(noise_multiplier=sigma, **kwargs)
        eps_less_noise = compute_epsilon(noise_multiplier=0.98 * sigma, **kwargs)
    assert eps <= target
    assert eps >= 0.99 * target
    assert eps_less_noise > target  # σ is (close to) the smallest that meets the target


def test_noise_multiplier_for_epsilon_microbatching_doubles_sigma():
    kwargs = dict(target_epsilon=3.0, num_examples=60000, batch_size=256, epochs=60,
                  delta=1e-5)
    single = noise_multiplier_for_epsilon(**kwargs)
    micro = noise_multiplier_for_epsilon(microbatch_size=32, **kwargs)
    assert micro == pytest.approx(2 * single, rel=1e-4)
    assert compute_epsilon(noise_multiplier=micro, microbatch_size=32,
                           **{k: v for k, v in kwargs.items() if k != "target_epsilon"}) <= 3.0


GOOD = dict(num_examples=1000, batch_size=10, noise_multiplier=1.0, epochs=1, delta=1e-5)


@pytest.mark.parametrize("change,name", [
    (dict(num_examples=0), "num_examples"),
    (dict(num_examples=-5), "num_examples"),
    (dict(num_examples=10.5), "num_examples"),
    (dict(batch_size=0), "batch_size"),
    (dict(batch_size=2000), "batch_size"),
    (dict(noise_multiplier=0.0), "noise_multiplier"),
    (dict(noise_multiplier=-1.0), "noise_multiplier"),
    (dict(delta=0.0), "delta"),
    (dict(delta=1.0), "delta"),
    (dict(delta=-1e-5), "delta"),
    (dict(epochs=None), "epochs"),
    (dict(steps=10), "epochs"),
    (dict(epochs=None, steps=0), "steps"),
    (dict(epochs=0), "epochs"),
    (dict(sampling="uniform"), "sampling"),
    (dict(accountant="gdp"), "accountant"),
    (dict(microbatch_size=0), "microbatch_size"),
    (dict(microbatch_size=11), "microbatch_size"),
])
def test_bad_input_raises_value_error_naming_argument(change, name):
    kwargs = dict(GOOD, **change)
    with pytest.raises(ValueError, match=name):
        compute_epsilon(**kwargs)
    kwargs.pop("noise_multiplier")
    if name != "noise_multiplier":
        with pytest.raises(ValueError, match=name):
            noise_multiplier_for_epsilon(target_epsilon=1.0, **kwargs)


@pytest.mark.parametrize("target", [0.0, -1.0, math.inf])
def test_bad_target_epsilon(target):
    kwargs = dict(GOOD)
    kwargs.pop("noise_multiplier")
    with pytest.raises(ValueError, match="target_epsilon"):
        noise_multiplier_for_epsilon(target_epsilon=target, **kwargs)


def test_large_delta_warns():
    with pytest.warns(UserWarning, match="delta=0.001 >= 1/num_examples"):
        compute_epsilon(**dict(GOOD, delta=1e-3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compute_epsilon(**GOOD)  # δ = 1e-5 < 1/1000: no warning


def test_scripts_reuse_the_accounting_defaults():
    """One definition of the defaults: the scripts, callback and audit import them."""
    from tf_tempered import callbacks  # pylint: disable=import-outside-toplevel
    from tf_tempered.audit.experiment import AuditConfig  # pylint: disable=import-outside-toplevel
    from tf_tempered.experiments import common  # pylint: disable=import-outside-toplevel
    from tf_tempered.privacy import epsilon  # pylint: disable=import-outside-toplevel

    assert (accounting.DEFAULT_DELTA, accounting.DEFAULT_SAMPLING,
            accounting.DEFAULT_ACCOUNTANT) == (1e-5, "poisson", "rdp")
    assert accounting.DEFAULT_SAMPLING in accounting.SAMPLINGS
    assert accounting.DEFAULT_ACCOUNTANT in accounting.ACCOUNTANTS
    assert common.SAMPLINGS is accounting.SAMPLINGS
    assert common.ACCOUNTANTS is accounting.ACCOUNTANTS
    config = common.TrainConfig()
    assert (config.delta, config.sampling, config.accountant) == (1e-5, "poisson", "rdp")
    assert AuditConfig().delta == accounting.DEFAULT_DELTA
    for function in (accounting.compute_epsilon, accounting.noise_multiplier_for_epsilon,
                     epsilon.privacy_report):
        parameters = inspect.signature(function).parameters
        assert parameters["sampling"].default == accounting.DEFAULT_SAMPLING, function
        assert parameters["accountant"].default == accounting.DEFAULT_ACCOUNTANT, function
    # PrivacyBudget follows the run: a private model's sampling and accountant, and for a
    # model tf_tempered does not train, shuffled batches (Keras' own) unless told.
    parameters = inspect.signature(callbacks.PrivacyBudget.__init__).parameters
    assert parameters["sampling"].default is None and parameters["accountant"].default is None


def test_pld_calibration_below_its_tight_bracket_searches_lower():
    # A short run where PLD's σ is under 0.85 × RDP's: the fallback search crashed
    # (AttributeError) before.
    settings = dict(num_examples=1000, batch_size=50, steps=7, delta=1e-4)
    sigma_rdp = noise_multiplier_for_epsilon(target_epsilon=0.5, **settings)
    assert compute_epsilon(noise_multiplier=0.85 * sigma_rdp, accountant="pld", **settings) < 0.5
    sigma = noise_multiplier_for_epsilon(target_epsilon=0.5, accountant="pld", **settings)
    assert sigma < 0.85 * sigma_rdp
    assert 0.495 <= compute_epsilon(noise_multiplier=sigma, accountant="pld", **settings) <= 0.5
