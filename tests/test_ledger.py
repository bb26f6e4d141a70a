# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""The privacy ledger's ε: the composition of its segments on dp_accounting, memoized."""

import collections

import dp_accounting
import numpy as np
import pytest

from tf_tempered.privacy import ledger as ledger_lib
from tf_tempered.privacy.ledger import PrivacyLedger, Segment

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def _direct(accountant, events, delta):
    return accountant.compose(dp_accounting.ComposedDpEvent(events)).get_epsilon(delta)


@pytest.mark.parametrize("name, accountant", [
    ("rdp", dp_accounting.rdp.RdpAccountant), ("pld", dp_accounting.pld.PLDAccountant)])
def test_epsilon_is_the_composition_of_the_segments(name, accountant):
    ledger = PrivacyLedger(delta=1e-5, accountant=name,
                           prior_events=[dp_accounting.GaussianDpEvent(20.0)])
    ledger.add(Segment("poisson", noise_multiplier=1.3, steps=10, sampling_probability=0.05))
    ledger.add(Segment("shuffle", noise_multiplier=2.0, steps=8, passes=2))
    events = [dp_accounting.GaussianDpEvent(20.0),
              dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
                  0.05, dp_accounting.GaussianDpEvent(1.3)), 10),
              dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(2.0), 2)]
    assert ledger.epsilon() == _direct(accountant(), events, 1e-5)


def test_the_same_composition_is_computed_once(monkeypatch):
    composed = []
    real = dp_accounting.rdp.RdpAccountant

    def counting():
        composed.append(1)
        return real()

    monkeypatch.setattr(dp_accounting.rdp, "RdpAccountant", counting)
    monkeypatch.setattr(ledger_lib, "_EPSILON_CACHE", collections.OrderedDict())  # none before
    ledger = PrivacyLedger(delta=1e-5)
    segment = Segment("poisson", noise_multiplier=1.2345, steps=16, sampling_probability=0.25)
    first = ledger.epsilon(extra=[segment])     # PrivacyBudget's look-ahead at one epoch
    ledger.add(segment)
    assert ledger.epsilon() == first and len(composed) == 1  # the epoch's end: no new work
    # Any other field is another composition, with its own ε.
    for other in (Segment("poisson", noise_multiplier=1.2345, steps=17,
                          sampling_probability=0.25),
                  Segment("poisson", noise_multiplier=1.2345 + 1e-12, steps=16,
                          sampling_probability=0.25)):
        assert PrivacyLedger(delta=1e-5, segments=[other]).epsilon() != first
    assert PrivacyLedger(delta=2e-5, segments=[segment]).epsilon() < first
    assert len(composed) == 4


def test_the_memo_is_bounded():
    for steps in range(1, ledger_lib._EPSILON_CACHE_SIZE + 20):
        PrivacyLedger(delta=1e-5, segments=[Segment("shuffle", noise_multiplier=3.0,
                                                    steps=steps, passes=steps)]).epsilon()
    assert len(ledger_lib._EPSILON_CACHE) == ledger_lib._EPSILON_CACHE_SIZE


def test_events_that_differ_anywhere_have_different_memo_keys():
    # NumPy prints long arrays with "..." in the middle: not in the key.
    counts = np.ones(2000, dtype=np.int64)
    other = counts.copy()
    other[1000] = 2
    first, second = (dp_accounting.SingleEpochTreeAggregationDpEvent(1.0, c)
                     for c in (counts, other))
    assert "..." in repr(first)
    assert ledger_lib._memo_key("rdp", 1e-5, [first]) != ledger_lib._memo_key(
        "rdp", 1e-5, [second])


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_many_fits_compose_as_one_segment_per_mechanism(monkeypatch, accountant):
    # fit in a loop adds a segment per fit; ε composes each mechanism once, its counts
    # added, and equals the ε of one segment of all those steps.
    composed = []
    real = ledger_lib._composed_epsilon
    monkeypatch.setattr(ledger_lib, "_composed_epsilon",
                        lambda name, delta, events: composed.append(events) or real(
                            name, delta, events))
    many = PrivacyLedger(delta=1e-5, accountant=accountant)
    for _ in range(30):
        many.add(Segment("poisson", noise_multiplier=1.1, steps=10, sampling_probability=0.01))
    many.add(Segment("shuffle", noise_multiplier=2.0, steps=8, passes=2))
    one = PrivacyLedger(delta=1e-5, accountant=accountant, segments=[
        Segment("poisson", noise_multiplier=1.1, steps=300, sampling_probability=0.01),
        Segment("shuffle", noise_multiplier=2.0, steps=8, passes=2)])
    assert many.epsilon() == pytest.approx(one.epsilon(), rel=1e-9)
    assert [e.count for e in composed[0]] == [300, 2]


def test_prior_events_are_a_multiset_union_of_the_lists_given():
    # Before: two equal releases in one list (two statistics of the same noise) counted once.
    first, second = dp_accounting.GaussianDpEvent(2.0), dp_accounting.GaussianDpEvent(2.0)
    other = dp_accounting.GaussianDpEvent(5.0)
    ledger = PrivacyLedger(delta=1e-5)
    ledger.add_prior_events([first, second])
    assert ledger.prior_events == [first, second]
    ledger.add_prior_events([first, second, other])  # the same releases again, and one more
    ledger.add_prior_events([first])
    assert ledger.prior_events == [first, second, other]
    both = dp_accounting.rdp.RdpAccountant().compose(
        dp_accounting.ComposedDpEvent([first, second, other])).get_epsilon(1e-5)
    assert ledger.epsilon() == pytest.approx(both, rel=1e-9)
