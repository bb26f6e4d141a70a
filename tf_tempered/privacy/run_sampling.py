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
"""How one fit's batches are drawn, as the accountant needs it (:class:`RunSampling`, made
by :mod:`~tf_tempered.privacy.fit_data`, read by the fit's RunAccount)."""

import dataclasses
import numbers
from typing import Optional

__all__ = ["RunSampling"]


@dataclasses.dataclass(frozen=True)
class RunSampling:
    """How one fit's batches are drawn, for the accountant.

    kind: "poisson" or "shuffle"; num_examples N and batch_size (expected, for Poisson)
    when known; sampling_probability q (Poisson); multi_example_microbatches: a
    microbatch may hold more than one example (TF Privacy's σ/2 accounting);
    steps_per_pass: the batches of one pass over the data (shuffled), when known;
    pass_weight: how many times each pass counts (a batch of a repeated pipeline may hold
    an example several times: pipeline_accounting.untagged_steps_per_pass);
    persistent_iterator: one iterator serves every epoch (an endless pipeline fit by
    steps_per_epoch, an iterator): its passes run on across epochs. Otherwise Keras starts
    the pipeline again each epoch, and each epoch starts passes of its own.
    """

    kind: str
    num_examples: Optional[int] = None
    batch_size: Optional[float] = None
    sampling_probability: Optional[float] = None
    multi_example_microbatches: bool = False
    steps_per_pass: Optional[numbers.Rational] = None  # a Fraction when batches span passes
    pass_weight: int = 1
    persistent_iterator: bool = False
