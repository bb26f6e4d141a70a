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
"""What a private model's training has spent: its DP steps, by the sampling that drew them.

Every DP step a model takes is recorded in its :class:`PrivacyLedger` as part of a
:class:`Segment` (a run of steps with one sampling and one σ), and ε at δ is the
composition of all segments (and of the releases made before training,
``prior_events``) read off one accountant. The segment's sampling is the one the
batches were actually drawn with:

* ``"poisson"``: each example in each step with probability q, secret membership
  (:func:`~tf_tempered.privacy.sampling.poisson_batches`, or ``fit`` on in-memory
  data by default): ``SelfComposed(PoissonSampled(q, Gaussian(σ')), steps)``, the
  amplified ε;
* ``"shuffle"``: batches in which each example appears at most once per pass over the
  data (Keras' shuffled batches): ``SelfComposed(Gaussian(σ'), passes)``, no
  amplification by subsampling;
* ``"unsampled"``: steps on batches the engine knows nothing about (``train_on_batch``,
  a custom loop): any example may be in every one, so each step is a Gaussian
  mechanism on its own, ``SelfComposed(Gaussian(σ'), steps)``.

σ' = σ/2 when a microbatch may hold more than one example (TF Privacy's convention:
a microbatch changes by one example, its clipped gradient by up to 2C in the
replace-one sense), else σ. σ = 0 spends an infinite ε.

>>> ledger = PrivacyLedger(delta=1e-5)
>>> ledger.add(Segment("poisson", noise_multiplier=1.1, steps=14063,
...                    sampling_probability=256 / 60000))
>>> round(ledger.epsilon(), 3)  # TF Privacy's MNIST tutorial: 60 epochs of q = 256/60000
2.597
"""

import collections
import dataclasses
import math
import sys
import threading
import uuid
from typing import Optional

import dp_accounting
import numpy as np

from tf_tempered.privacy import accounting

__all__ = ["SAMPLINGS", "Segment", "PrivacyLedger", "segments_of", "prior_events_of"]

SAMPLINGS = ("poisson", "shuffle", "unsampled")


@dataclasses.dataclass(frozen=True)
class Segment:
    """A run of DP steps with one sampling and one noise multiplier.

    ``steps``: DP steps taken; ``passes`` (shuffle): passes over the data they made
    (each example at most once per pass); ``sampling_probability`` (poisson): q;
    ``multi_example_microbatches``: a microbatch may hold more than one example.
    """

    sampling: str
    noise_multiplier: float
    steps: int = 0
    passes: int = 0
    sampling_probability: Optional[float] = None
    multi_example_microbatches: bool = False

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"Segment.sampling must be one of {SAMPLINGS}, got "
                             f"{self.sampling!r}.")
        if self.sampling == "poisson" and not 0 < (self.sampling_probability or 0) <= 1:
            raise ValueError(f"A Poisson segment needs sampling_probability in (0, 1], got "
                             f"{self.sampling_probability!r}.")

    @property
    def mechanisms(self):
        """How many times the segment's mechanism composes (steps, or passes for shuffle)."""
        return self.passes if self.sampling == "shuffle" else self.steps

    def event(self):
        """The dp_accounting DpEvent of the segment (None when it spent nothing)."""
        if self.mechanisms == 0:
            return None
        sigma = self.noise_multiplier / 2.0 if self.multi_example_microbatches \
            else self.noise_multiplier
        event = dp_accounting.GaussianDpEvent(sigma)
        if self.sampling == "poisson":
            event = dp_accounting.PoissonSampledDpEvent(self.sampling_probability, event)
        return dp_accounting.SelfComposedDpEvent(event, self.mechanisms)

    def describe(self):
        """The segment in words, for logs and reports."""
        if self.sampling == "poisson":
            how = f"Poisson sampling, q={self.sampling_probability:.4g}, {self.steps} steps"
        elif self.sampling == "shuffle":
            how = (f"shuffled batches (no amplification), {self.passes} passes over the data "
                   f"in {self.steps} steps")
        else:
            how = f"{self.steps} steps on batches the engine did not draw (no amplification)"
        return f"σ={self.noise_multiplier:g}, {how}"


class PrivacyLedger:
    """The segments of DP steps a model has taken, and the ε at δ they spend together.

    ``prior_events``: releases computed on the same data before training (e.g. DP
    feature statistics), composed into every ε. ``id``: this ledger's own (random; a
    ledger read back from a config gets a new one); ``absorbed``: of each other ledger
    whose saved steps were added here, the segments added (:mod:`.ledger_lineage`);
    ``merged_ids``: the ledgers merged into this one whole (:mod:`.shared_ledgers`).
    """

    def __init__(self, *, delta=accounting.DEFAULT_DELTA, accountant=accounting.DEFAULT_ACCOUNTANT,
                 segments=(), prior_events=()):
        if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}; e.g. delta=1e-5 "
                             "(well below 1/number of training examples).")
        if accountant not in accounting.ACCOUNTANTS:
            raise ValueError(f"accountant must be one of {accounting.ACCOUNTANTS}, got "
                             f"{accountant!r}.")
        self.delta = float(delta)
        self.accountant = accountant
        self.segments = list(segments)
        self.prior_events = list(accounting.check_prior_events(prior_events))
        self.id = uuid.uuid4().hex
        self.absorbed = {}
        self.merged_ids = set()

    def add(self, segment):
        """Records a finished segment (one without steps is dropped). Unsampled steps
        right after unsampled steps of the same mechanism extend them (one segment for a
        loop of train_on_batch calls, each recorded as it returns)."""
        if not (segment.steps or segment.passes):
            return
        last = self.segments[-1] if self.segments else None
        if (segment.sampling == "unsampled" and last is not None
                and dataclasses.replace(last, steps=segment.steps) == segment):
            self.segments[-1] = dataclasses.replace(last, steps=last.steps + segment.steps)
            return
        self.segments.append(segment)

    def add_prior_events(self, events):
        """Composes releases on the same data into every later ε.

        ``events`` lists the releases made: the ledger keeps, of each distinct event, as many
        as the most any call listed (a multiset union), so a list given again (each fit's
        PrivacyBudget, a resumed run) is not counted twice, while two equal releases in one
        list (two statistics of the same noise) are two.
        """
        events = list(accounting.check_prior_events(events))
        for event in events:
            listed = sum(event == e for e in events)
            held = sum(event == e for e in self.prior_events)
            self.prior_events.extend([event] * max(0, listed - held))

    @property
    def steps(self):
        """DP steps recorded in all segments."""
        return sum(s.steps for s in self.segments)

    def epsilon(self, extra=()):
        """ε at δ of the recorded segments, the prior events and ``extra`` segments.

        ``extra``: segments not recorded (yet), e.g. the run in progress, or the next
        epoch of it (PrivacyBudget's stopping rule). ``math.inf`` if a segment with
        steps has σ = 0; 0.0 if nothing was spent.
        """
        segments = [s for s in [*self.segments, *extra] if s.mechanisms]
        if any(s.noise_multiplier == 0 for s in segments):
            return math.inf
        events = merged_events([*self.prior_events, *(s.event() for s in segments)])
        if not events:
            return 0.0
        return _composed_epsilon(self.accountant, self.delta, events)

    def samplings(self, extra=()):
        """The samplings of the recorded (and ``extra``) segments that spent something."""
        return sorted({s.sampling for s in [*self.segments, *extra] if s.mechanisms})

    def to_config(self):
        """A JSON-serializable dict (saved with the model; no secret in it)."""
        return {"delta": self.delta, "accountant": self.accountant,
                "segments": [dataclasses.asdict(s) for s in self.segments],
                "prior_events": [_plain(e.to_named_tuple()) for e in self.prior_events],
                "id": self.id,
                "absorbed": {key: [dataclasses.asdict(s) for s in segments]
                             for key, segments in self.absorbed.items()}}

    @classmethod
    def from_config(cls, config):
        """The ledger :meth:`to_config` described, under an id of its own: it holds the
        described ledger's steps so far (``absorbed``), and goes on apart from it.

        >>> ledger = PrivacyLedger(delta=1e-6, prior_events=[dp_accounting.GaussianDpEvent(8.0)])
        >>> ledger.add(Segment("shuffle", noise_multiplier=2.0, steps=10, passes=2))
        >>> again = PrivacyLedger.from_config(ledger.to_config())
        >>> again.epsilon() == ledger.epsilon(), again.segments == ledger.segments
        (True, True)
        >>> again.id != ledger.id, list(again.absorbed) == [ledger.id]
        (True, True)
        """
        ledger = cls(delta=config["delta"], accountant=config["accountant"],
                     segments=segments_of(config["segments"]),
                     prior_events=prior_events_of(config))
        ledger.absorbed = {key: segments_of(segments)
                           for key, segments in config.get("absorbed", {}).items()}
        if config.get("id"):
            ledger.absorbed[config["id"]] = list(ledger.segments)
        return ledger


def prior_events_of(config):
    """The prior DpEvents a :meth:`PrivacyLedger.to_config` dict lists."""
    return [_event(e) for e in config.get("prior_events", ())]


def segments_of(configs):
    """The Segments ``configs`` (dicts, as :meth:`PrivacyLedger.to_config` writes) describe."""
    return [Segment(**s) for s in configs]


def merged_events(events):
    """``events`` with the self-composed ones of one mechanism merged into one (counts added).

    The same composition (composition is commutative): RDP adds an event's RDP curve
    ``count`` times, PLD self-composes it ``count`` times. Without it ε after k fits (each
    its own segment: ``fit`` in a loop, a benchmark's short fits) composed k events: the
    epoch-end ε took 0.2 ms per segment on the MNIST run, 6 ms after 30 fits.

    >>> gauss = dp_accounting.GaussianDpEvent(1.1)
    >>> merged_events([dp_accounting.SelfComposedDpEvent(gauss, 3), gauss,
    ...                dp_accounting.SelfComposedDpEvent(gauss, 4)])
    [SelfComposedDpEvent(event=GaussianDpEvent(noise_multiplier=1.1), count=7), GaussianDpEvent(noise_multiplier=1.1)]
    """
    groups = {}  # repr of the inner event -> [the event, its summed count]
    merged = []  # events, and the groups (lists) in the order they first appear
    for event in events:
        if not isinstance(event, dp_accounting.SelfComposedDpEvent):
            merged.append(event)
            continue
        key = _memo_key(None, None, [event.event])
        if key in groups:
            groups[key][1] += event.count
        else:
            groups[key] = [event.event, event.count]
            merged.append(groups[key])
    return [dp_accounting.SelfComposedDpEvent(*e) if isinstance(e, list) else e for e in merged]


# ε of one composition, by (accountant, δ, repr of the events): a fit asks for the same ε
# several times (its epoch log, PrivacyBudget's check; the budget's look-ahead one epoch
# is the next epoch's ε), and one RDP composition of a Poisson-subsampled Gaussian costs
# up to 0.5 s for a large q. The repr of a DpEvent (an attrs class) holds every field,
# floats exactly and NumPy arrays whole (printed without NumPy's "..." summary).
_EPSILON_CACHE = collections.OrderedDict()
_EPSILON_CACHE_SIZE = 256
_EPSILON_CACHE_LOCK = threading.Lock()


def _memo_key(accountant_name, delta, events):
    with np.printoptions(threshold=sys.maxsize):
        return accountant_name, delta, repr(list(events))


def _composed_epsilon(accountant_name, delta, events):
    """ε at δ of ComposedDpEvent(events) on the named accountant (memoized)."""
    key = _memo_key(accountant_name, delta, events)
    with _EPSILON_CACHE_LOCK:
        if key in _EPSILON_CACHE:
            _EPSILON_CACHE.move_to_end(key)
            return _EPSILON_CACHE[key]
    epsilon = float(accounting.make_accountant(accountant_name)
                    .compose(dp_accounting.ComposedDpEvent(list(events))).get_epsilon(delta))
    with _EPSILON_CACHE_LOCK:
        _EPSILON_CACHE[key] = epsilon
        if len(_EPSILON_CACHE) > _EPSILON_CACHE_SIZE:
            _EPSILON_CACHE.popitem(last=False)
    return epsilon


def _plain(value):
    """A DpEvent's named tuple as JSON-serializable dicts and lists."""
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _event(value):
    """The DpEvent _plain described."""
    if isinstance(value, dict) and "class_name" in value:
        cls = getattr(dp_accounting, value["class_name"])
        return cls(**{k: _event(v) for k, v in value.items()
                      if k not in ("module_name", "class_name")})
    if isinstance(value, list):
        return [_event(v) for v in value]
    return value
