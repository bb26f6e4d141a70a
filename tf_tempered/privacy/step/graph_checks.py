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
"""The step's checks that read the traced graph, for a step that runs eagerly.

Two refusals read the graph a traced DP step builds: a weight read outside its layer's
call (:func:`tf_tempered.privacy.coverage.refuse_reads_outside_calls`) and a layer called on
rows that are not the batch's (:mod:`tf_tempered.privacy.example_rows`). Eagerly
(``run_eagerly=True``, a DPGradients call outside ``tf.function``) there is no graph, and
a tied embedding trained with its tied use's gradient missing. So every eager step also
traces stages 3-7 (nothing runs), before its forward pass when the model is built (a
refused write of the batch into a variable is not made), else after that pass has built
it, before its update is applied. Every step, not once per model: eagerly the layers'
Python runs again each step, and a flag flipped between fits or by a callback (batch
centering switched on, a tied projection, a write of the batch into a weight) trained
unchecked, one example moving the update 9-14 C (probe D3, F1). The trace costs 4.5-7x a
small model's eager step on 2 CPU cores (benchmarks/eager_checks.py); a step in
tf.function is traced, and checked, once per signature.
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import UnsupportedLayerError
from tf_tempered.privacy.step.batch import unpack_batch
from tf_tempered.privacy.step.chunks import clipped_passes
from tf_tempered.privacy.step.plan import plan_step

__all__ = ["check_in_a_graph"]


@tf.autograph.experimental.do_not_convert
def check_in_a_graph(model, state, data, losses):
    """Traces stages 3-7 of ``model``'s step on ``data``'s signature; the graph-reading
    checks raise there. ``losses``: DPGradients' loss container, or None."""

    def traced(traced_data):
        plan = plan_step(model, state, check_optimizer=losses is None)
        batch = unpack_batch(traced_data, xla=plan.xla,
                             input_shapes=keras_bridge.declared_input_shapes(model))
        clipped_passes(model, state, plan, batch, losses=losses)

    try:
        with keras_bridge.custom_gradients_dropped():  # never differentiated: not kept
            tf.function(traced, autograph=False).get_concrete_function(data)
    except (NotImplementedError, tf.errors.OperatorNotAllowedInGraphError) as failure:
        # Code that runs only eagerly (numpy of a tensor, a Python bool of one) failed
        # here with TF's own error, naming no fix (probe D3, F2).
        raise UnsupportedLayerError(_EAGER_ONLY.format(failure=failure)) from failure


_EAGER_ONLY = (
    "An eager DP step is also traced for the checks that read its graph (that no layer "
    "mixes the batch's examples, no weight is read outside its layer's call, no data is "
    "written into a variable), and the trace failed: a layer's call runs only on eager "
    "tensors ({failure}). Fix: write that call with TensorFlow ops (tf.sign instead of "
    "np.sign(np.asarray(t)), tf.cond or tf.where instead of a Python if on a tensor), as "
    "fit without run_eagerly=True needs anyway.")
