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
"""Saved ledgers added to a model's, each DP step once (tf_tempered.privacy.ledger_lineage)."""

import dp_accounting
import pytest

from tf_tempered.privacy.ledger import PrivacyLedger, Segment
from tf_tempered.privacy.ledger_lineage import absorb, merge_lineage

# Keras-independent code: runs in the Keras 3 suite (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite


def _poisson(steps):
    return Segment("poisson", 1.1, steps=steps, sampling_probability=0.01)


def _ledger(*segments):
    ledger = PrivacyLedger()
    for segment in segments:
        ledger.add(segment)
    return ledger


def test_two_branches_of_one_saved_ledger_count_the_shared_start_once():
    # Two processes load the same checkpoint and train on: a model loading the weights of
    # both counts the checkpoint's 100 steps once and each branch's own.
    saved = _ledger(_poisson(100)).to_config()
    first, second = PrivacyLedger.from_config(saved), PrivacyLedger.from_config(saved)
    first.add(_poisson(10))
    second.add(Segment("shuffle", 1.1, steps=20, passes=1))
    model = PrivacyLedger()
    assert absorb(model, first.to_config()) == 110
    assert absorb(model, second.to_config()) == 20  # beyond the 100 it holds of `saved`
    assert absorb(model, saved) == 0
    assert model.steps == 130


def test_a_branch_of_an_unsampled_run_merged_into_its_last_segment():
    # train_on_batch steps extend the last unsampled segment, also the one a resumed
    # ledger began with: the copy is still subtracted, not the branch's own steps.
    saved = _ledger(Segment("unsampled", 1.1, steps=30)).to_config()
    branch = PrivacyLedger.from_config(saved)
    branch.add(Segment("unsampled", 1.1, steps=5))
    assert [s.steps for s in branch.segments] == [35]
    model = PrivacyLedger()
    model.add(Segment("unsampled", 1.1, steps=2))
    assert absorb(model, _ledger(Segment("unsampled", 1.1, steps=20)).to_config()) == 20
    assert absorb(model, saved) == 30  # another ledger's 30 steps
    assert absorb(model, branch.to_config()) == 5


def test_a_resumed_run_saved_again_adds_only_its_own_steps():
    run = _ledger(_poisson(100))
    epoch_1 = run.to_config()
    resumed = PrivacyLedger.from_config(epoch_1)  # loaded in a new process, trained on
    resumed.add(_poisson(50))
    model = PrivacyLedger()
    assert absorb(model, epoch_1) == 100
    assert absorb(model, resumed.to_config()) == 50
    run.add(_poisson(30))  # the first run went on too: only its 30 new steps
    assert absorb(model, run.to_config()) == 30
    assert model.steps == 180


def test_a_ledger_merged_in_whole_adds_nothing_when_loaded_again():
    shared, other = _ledger(_poisson(5)), _ledger(_poisson(7))
    snapshot = other.to_config()
    merge_lineage(other, shared)  # shared weights: other's every step is in shared now
    assert absorb(shared, snapshot) == 0


def test_prior_events_are_a_union():

    release = dp_accounting.GaussianDpEvent(8.0)
    saved = PrivacyLedger(prior_events=[release]).to_config()
    model = PrivacyLedger(prior_events=[release])
    absorb(model, saved)
    assert model.prior_events == [release]
