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
"""Stage 4 of the DP step: one backward pass, to the recorded layers' outputs.

The gradient of the summed microbatch losses with respect to each recorded call's
output (stage 2's ``total``), checked to cover every trainable variable: a variable
the loss depends on without a recorded call of its layer is refused (its gradient would
be missing from the norm), see :mod:`tf_tempered.privacy.coverage`. Half-precision
tensors (mixed precision) are widened to float32 for the norms.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import coverage, layer_grads
from tf_tempered.privacy.layer_grads import clip_weights as clip

__all__ = ["backward"]


def backward(model, forward, plan, batch_size):
    """(layer_grads.MicrobatchLayout, [(first record, records of that layer)]) with the output
    gradients of every record filled in."""
    records = forward.recorder.records
    unrecorded = coverage.check(model, records)
    coverage.refuse_reads_outside_calls(forward.recorder, loss=forward.total)
    layout = layer_grads.MicrobatchLayout(forward.num_microbatches, forward.examples_per_microbatch,
                                        plan.options, batch_size, xla=plan.xla)
    # One entry per layer: a layer called more than once (shared weights) gets the
    # per-example sum of its calls' contributions.
    groups = layer_grads.multi_call.group_calls(records)
    hooks = forward.recorder.norm_hooks
    if hooks is not None:  # norms inside this backward pass (norm_hooks.py)
        hooks.layout, hooks.collecting = layout, True
        hooks.skip = {id(call) for _, calls in groups if len(calls) > 1 for call in calls}
    outputs = [r.output for r in records]
    # The variables no recorded call covers are differentiated only to see, while
    # tracing, whether the loss depends on them (their gradient ops are unused).
    grads = forward.tape.gradient(forward.total, outputs + [var for var, _ in unrecorded])
    coverage.refuse_unrecorded_dependencies(model, unrecorded, grads[len(outputs):])
    for record, output, g in zip(records, outputs, grads):
        # A structure for a recurrent layer returning [output, *states].
        record.grad_output = tf.nest.map_structure(
            lambda o, d: clip.widen(tf.zeros_like(o) if d is None else d), output, g)
    # Work on the recorded inputs (patches, transposes) needs no gradient; held until
    # the forward pass is done, it does not take cores from its convolutions.
    with tf.control_dependencies([forward.total]):
        for record in records:
            record.inputs = tf.nest.map_structure(lambda t: clip.widen(tf.identity(t)),
                                                  record.inputs)
    if hooks is not None:
        hooks.collecting = False  # the second pass must not compute norms again
    return layout, groups
