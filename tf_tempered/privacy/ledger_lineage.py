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
"""Adding a saved ledger to a model's, each DP step once.

A ledger saved with weights (``save_weights``, a backup) or in a ledger file is a snapshot
of one ledger X (its ``id``) at one time. X only grows: segments are appended, and the last
one's steps extended (an unsampled run of ``train_on_batch``, a fit in progress). So a later
snapshot of X extends an earlier one, and a model's ledger M adds a snapshot of X by what
it holds of X already:

* X is M, or merged into M: nothing (M holds X's every step, those since the save too);
* M added an earlier snapshot of X (``M.absorbed[X]``): the steps beyond it;
* an older snapshot than the one M added: nothing;
* X began as a copy of a ledger A (a run resumed from A's save) of which M holds some:
  X's steps after the copy, and those of the copy M lacks;
* otherwise all of it (e.g. two snapshots of X that do not extend one another: over-counts,
  never under-counts).

A snapshot's own ``absorbed`` (what X had added of other ledgers) is kept, so a later
snapshot of those adds only its new steps (their older steps are inside X's segments).
Each rule subtracts only segments the snapshot's list begins with (``steps_beyond``):
composition depends on the steps of each mechanism, not their order, so what is subtracted
is a part of what both hold.

>>> from tf_tempered.privacy.ledger import PrivacyLedger, Segment
>>> run = PrivacyLedger()
>>> run.add(Segment("shuffle", 1.1, steps=10, passes=2))
>>> epoch_2 = run.to_config()
>>> run.add(Segment("shuffle", 1.1, steps=5, passes=1))
>>> resumed = PrivacyLedger()                         # a new process, a new model
>>> [absorb(resumed, c) for c in (epoch_2, run.to_config(), epoch_2)]  # steps added
[10, 5, 0]
>>> absorb(run, epoch_2)                               # its own checkpoint
0
"""

import dataclasses
import json

from tf_tempered.privacy.ledger import PrivacyLedger, prior_events_of, segments_of

__all__ = ["absorb", "steps_beyond", "merge_lineage", "combined_dp"]


def absorb(ledger, config):
    """Adds the steps of the saved ledger ``config`` (a ``to_config()`` dict) that
    ``ledger`` does not hold yet; returns how many."""
    if config.get("parts"):  # a union of saved ledgers (combined_dp): each part once
        return sum(absorb(ledger, part) for part in config["parts"])
    snapshot = segments_of(config["segments"])
    ledger.add_prior_events(prior_events_of(config))
    key = config.get("id")
    if key is not None and (key == ledger.id or key in ledger.merged_ids):
        return 0
    held = ledger.absorbed.get(key) if key is not None else None
    if held is None:
        new = _beyond_held_start(ledger, config, snapshot)
    else:
        new = steps_beyond(held, snapshot)
        if new is None:  # not an extension of what it holds: older (nothing) or a branch
            new = [] if steps_beyond(snapshot, held) is not None else snapshot
    ledger.segments.extend(s for s in new if s.mechanisms)
    for other, segments in config.get("absorbed", {}).items():
        if other != ledger.id and other not in ledger.merged_ids:
            _keep_longer(ledger.absorbed, other, segments_of(segments))
    if key is not None:
        _keep_longer(ledger.absorbed, key, snapshot)
    return sum(s.steps for s in new)


def _beyond_held_start(ledger, config, snapshot):
    """The part of ``snapshot`` ``ledger`` lacks, when ``snapshot`` begins with the steps of
    a ledger A it absorbed (a run resumed from A's save: ``from_config``) of which ``ledger``
    holds some; else all of it."""
    for other, segments in config.get("absorbed", {}).items():
        start = segments_of(segments)
        own = steps_beyond(start, snapshot)  # the steps after the copy of A it began with
        if own is None:
            continue
        if other == ledger.id or other in ledger.merged_ids:
            return own  # ledger holds all of A
        held = ledger.absorbed.get(other)
        if held is not None and steps_beyond(start, held) is not None:
            return own  # ledger holds at least as much of A
        missing = None if held is None else steps_beyond(held, start)
        if missing is not None:
            return [*missing, *own]
    return snapshot


def steps_beyond(earlier, later):
    """The segments ``later`` (a snapshot of one ledger) adds to ``earlier``, or None when
    ``later`` does not extend it.

    >>> from tf_tempered.privacy.ledger import Segment
    >>> a = Segment("unsampled", 1.0, steps=3)
    >>> steps_beyond([a], [dataclasses.replace(a, steps=5), a])
    [Segment(sampling='unsampled', noise_multiplier=1.0, steps=2, passes=0, sampling_probability=None, multi_example_microbatches=False), Segment(sampling='unsampled', noise_multiplier=1.0, steps=3, passes=0, sampling_probability=None, multi_example_microbatches=False)]
    >>> steps_beyond([a, a], [a]) is None
    True
    """
    if not earlier:
        return list(later)
    if len(later) < len(earlier) or later[:len(earlier) - 1] != earlier[:-1]:
        return None
    last, grown = earlier[-1], later[len(earlier) - 1]
    if (dataclasses.replace(grown, steps=last.steps, passes=last.passes) != last
            or grown.steps < last.steps or grown.passes < last.passes):
        return None
    more = dataclasses.replace(grown, steps=grown.steps - last.steps,
                               passes=grown.passes - last.passes)
    return [more, *later[len(earlier):]]


def merge_lineage(ledger, target):
    """``ledger`` merged into ``target`` whole (shared weights): what either held of
    other ledgers, and that ``target`` now holds ``ledger``'s every step."""
    target.merged_ids |= {ledger.id, *ledger.merged_ids}
    for key, segments in ledger.absorbed.items():
        _keep_longer(target.absorbed, key, segments)


def _keep_longer(absorbed, key, segments):
    held = absorbed.get(key)
    if held is None or steps_beyond(held, segments) is not None:
        absorbed[key] = list(segments)


def combined_dp(dps):
    """One DP dict for weights that several private models' steps trained: the first's
    settings, and the union of their ledgers (each step once, by :func:`absorb`; ledgers
    that share no history are composed whole, an over-count when they trained on different
    data), which keeps its ``parts``.

    >>> from tf_tempered.privacy.ledger import Segment
    >>> a, b = PrivacyLedger(), PrivacyLedger()
    >>> a.add(Segment("shuffle", 1.1, steps=10, passes=2))
    >>> b.add(Segment("shuffle", 0.9, steps=4, passes=1))
    >>> dp_a, dp_b = {"ledger": a.to_config()}, {"ledger": b.to_config()}
    >>> both = combined_dp([dp_a, dp_b])
    >>> again = combined_dp([dp_a, dp_b, both])    # the union with its own parts
    >>> [sum(s["steps"] for s in d["ledger"]["segments"]) for d in (both, again)]
    [14, 14]
    """
    dps = [dp for dp in dps if dp is not None]
    if len(dps) <= 1:
        return dps[0] if dps else None
    # The union keeps its parts: a union holding it (a save of weights loaded from several
    # files, read back with them) absorbs each part once, not its concatenated segments.
    parts = {json.dumps(part, sort_keys=True): part for dp in dps if dp.get("ledger")
             for part in (dp["ledger"].get("parts") or [dp["ledger"]])}
    if not parts:
        return {**dps[0], "ledger": None}
    union = PrivacyLedger(delta=min(c["delta"] for c in parts.values()),
                          accountant=next(iter(parts.values()))["accountant"])
    for config in parts.values():
        absorb(union, config)
    return {**dps[0], "ledger": {**union.to_config(), "parts": list(parts.values())}}
