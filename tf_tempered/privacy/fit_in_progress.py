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
"""DP steps of a private model taken during its own fit, by a callback: refused.

A fit counts every DP step its model's noise key runs while it is under way among its
own sampled ones (q = B/N, or its passes). A step on a batch a callback chose
(``self.model.train_on_batch(x[:16], y[:16])``, a DPGradients step) was then accounted
with the fit's amplification: ε 4.41 reported for 6.59 (8 Poisson steps and 2 such; probe
P). A fit of the model nested in its own fit counted its steps twice.
"""

from tf_tempered import keras_bridge
from tf_tempered.privacy.state import get_state

__all__ = ["refuse_during_own_fit"]


# Why a DP step or a nested fit is refused, and its fix ({what}: what was called).
_COUNTED = (
    "the fit counts every DP step taken while it runs among its own sampled batches, so a "
    "step on a batch of your choosing would be accounted with the fit's amplification by "
    "sampling (ε under-reported)")
_COUNTED_FIX = ("take it before or after the fit (model.fit(...), then {what}), or give its "
                "data to the fit")


def refuse_during_own_fit(model, what, why=_COUNTED, fix=_COUNTED_FIX):
    """Raises RuntimeError if ``model``'s fit is under way and ``what`` (a DP step, a fit or
    make_private of it) is not that fit's own step (a Model's train_step on the stack); the
    message says ``why`` and ``fix`` (``{what}`` in them is ``what``)."""
    state = get_state(model)
    run = getattr(state, "run", None)
    # (The model's own train_step, not any Model's: a callback's throwaway model's train_step
    # calling this model's train_on_batch passed; probe A2, F4.)
    if run is None or run.finished or keras_bridge.traced_by_a_fit(model):
        return
    raise RuntimeError(f"{what} of a private model during its own fit (from a callback?): "
                       f"{why}. Fix: {fix.format(what=what)}.")
