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
"""Stage 3's refusals, read off the traced forward pass (once per trace, nothing per step).

DP-SGD's bound holds when example i's clipped gradient is all that example i changes.
Four ways a forward pass breaks that, each refused with the fix before any update:

* a layer called on rows that are not the batch's examples in order, or on values
  mixed across examples (:func:`tf_tempered.privacy.example_rows.refuse_calls_off_the_batch`);
* per-example losses computed from several examples
  (:func:`tf_tempered.privacy.example_rows.refuse_mixed_losses`);
* a variable written from the batch's data
  (:func:`tf_tempered.privacy.state_writes.refuse_writes_from_the_batch`);
* a gradient the forward pass defines itself, which may mix examples in the backward pass
  (:func:`tf_tempered.privacy.custom_gradients.refuse_custom_gradients`).

The same walk tells which call arguments the examples share
(:func:`tf_tempered.privacy.shared_args.mark_shared_call_args`), for the generic VJP.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import custom_gradients, example_rows, shared_args, state_writes

__all__ = ["guarded", "refuse_cross_example_forward"]


def refuse_cross_example_forward(recorder, batch, losses):
    """Raises for a forward pass in which one example reaches another's rows, losses or a
    variable. ``recorder``: the step's Recorder, after the forward pass; ``batch``: the
    step's Batch; ``losses``: the [rows] per-example losses. Returns what is left to check
    when the step runs (a bool tensor: the batch's length unknown while tracing, reshapes
    keep whole examples in each row; :func:`guarded`), or None."""
    walked = example_rows.refuse_calls_off_the_batch(recorder.records, batch.x,
                                                     losses.shape[0])
    example_rows.refuse_mixed_losses(losses, (batch.y, batch.loss_weight, batch.poisson_mask),
                                     walked)
    shared_args.mark_shared_call_args(recorder.records, walked)
    state_writes.refuse_writes_from_the_batch(recorder.forward_ops,
                                              (batch.x, batch.y, batch.loss_weight))
    custom_gradients.refuse_custom_gradients(recorder.forward_ops)
    return example_rows.whole_examples_per_row(walked, losses)


def guarded(summed, whole_examples):
    """``summed`` ({key: clipped sum}) once ``whole_examples`` (refuse_cross_example_forward's
    check, or None) holds, when the step runs: else the step fails before any update, and
    under XLA, which drops the assertion, the sums turn NaN (nothing trains)."""
    if whole_examples is None:
        return summed
    poison = tf.where(whole_examples, 1.0, float("nan"))
    with tf.control_dependencies([tf.debugging.Assert(whole_examples, [_MERGED_EXAMPLES])]):
        poison = tf.identity(poison)
    return {key: value * tf.cast(poison, value.dtype) for key, value in summed.items()}


_MERGED_EXAMPLES = (
    "A reshape put rows of several examples together (its first axis is no multiple of the "
    "batch's length, e.g. [B, F] -> [B/2, 2, F]): a statistic of each row mixes examples, "
    "and no example's clipped gradient bounds what it changes. Fix: keep each example's "
    "values in rows of its own (reshape to [-1, ...] with the batch's length first, "
    "tf.shape(t)[0]), or compute such statistics from public data.")
