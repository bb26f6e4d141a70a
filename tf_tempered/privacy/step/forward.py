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
"""Stage 3 of the DP step: the forward pass, recorded, and each microbatch's loss.

The model runs once with a Recorder active (each trainable layer's call leaves its
input and output, see :mod:`tf_tempered.privacy.recording`), under a gradient tape.
Each row's loss is the user's compiled loss per example
(:mod:`tf_tempered.privacy.per_example_loss`) plus its activity-regularization penalty
(:func:`activity_penalties`), and microbatch m's loss is the mean of its rows' losses:

    loss_m = (1/R) Σ_{r in m} ℓ_r,    total = Σ_m loss_m,

whose gradient the one backward pass takes (stage 3).
"""

import dataclasses
from typing import Any, Callable, List

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import microbatching, recording
from tf_tempered.privacy.errors import UnsupportedLayerError
from tf_tempered.privacy.per_example_loss import per_example_losses
from tf_tempered.privacy.step.forward_checks import refuse_cross_example_forward
from tf_tempered.privacy.step.random_ops import ForwardOps
from tf_tempered.privacy.step.second_pass_checks import computation, same_ops_as_first

__all__ = ["Forward", "record_forward", "activity_penalties"]


@dataclasses.dataclass
class Forward:
    """What the forward pass left: the tape, the records and the losses.

    ``losses`` [rows] and ``output_losses`` (one [rows] per compiled output loss) are
    float32; ``num_microbatches`` M and ``examples_per_microbatch`` (None if not
    static) the layout; ``recompute(after)`` runs the forward pass again (clipped_sum
    "recompute") and returns the microbatch losses; ``whole_examples``: a bool tensor the
    clipped sum waits for (forward_checks.guarded), or None.
    """

    tape: Any
    recorder: Any
    y_pred: Any
    losses: Any
    output_losses: List[Any]
    num_microbatches: Any
    examples_per_microbatch: Any
    microbatch_losses: Any
    total: Any
    recompute: Callable[..., Any]
    whole_examples: Any = None

    @property
    def rows(self):
        """The number of rows, a scalar tensor."""
        return tf.shape(self.losses)[0]


def activity_penalties(captured, rows):
    """Σ over captured (layer, regularizer, outputs) of each row's penalty, [rows] float32.

    Keras adds regularizer(output) / batch size for the whole batch; the penalty of
    row i is regularizer(output_i), so their mean is Keras' term and no row's loss
    depends on another row. Exact for regularizers that sum over entries (L1, L2).
    """
    total = None
    for layer, regularizer, outputs in captured:
        for out in tf.nest.flatten(outputs):
            if not isinstance(out, tf.Tensor) or out.shape.rank == 0:
                continue
            if out.shape[0] is not None and isinstance(rows, int) and out.shape[0] != rows:
                raise UnsupportedLayerError(
                    f"Layer {layer.name!r} has an activity_regularizer, and its output has "
                    f"{out.shape[0]} rows where the batch has {rows}, so its penalty cannot "
                    "be split per example. Fix: regularize a layer whose output has the "
                    "batch's examples on its first axis, or drop activity_regularizer.")
            per_row = tf.vectorized_map(
                lambda o, reg=regularizer: tf.cast(reg(o[None]), tf.float32),
                tf.cast(out, tf.float32))
            per_row = tf.reshape(per_row, [-1])
            total = per_row if total is None else total + per_row
    return total


def _refuse_added_losses(model):
    """Raises for losses Keras adds outside the compiled loss (weight regularizers, add_loss)."""
    if not keras_bridge.step_losses(model):
        return
    regularized = [f"{layer.name}.{name}" for layer in keras_bridge.flatten_layers(model)
                   for name in ("kernel_regularizer", "bias_regularizer",
                                "embeddings_regularizer", "recurrent_regularizer",
                                "depthwise_regularizer", "pointwise_regularizer",
                                "gamma_regularizer", "beta_regularizer")
                   if getattr(layer, name, None) is not None]
    where = (f" (weight regularizers: {', '.join(regularized[:5])})" if regularized
             else " (add_loss in a layer's call, or a weight's add_weight(regularizer=...))")
    raise ValueError(
        f"The model has losses outside its compiled loss{where}. The fast DP engine "
        "clips each example's gradient of its own loss and cannot fold a penalty of the "
        "weights or of the whole batch into it. Fix: remove weight regularizers (use the "
        "optimizer's weight decay, e.g. keras.optimizers.AdamW(weight_decay=...), or rely "
        "on clipping and noise) and add_loss calls (a model compiled with loss=None: "
        "compile a loss of (y_true, y_pred) returning one value per example, or override "
        "compute_loss to return one loss per example); activity_regularizer is supported "
        "(each example's penalty joins its own loss).")


def _losses(model, batch, plan, recorder, container):
    """(row losses [rows], output losses, y_pred) of one forward pass with ``recorder``."""
    layers = keras_bridge.activity_regularized_layers(keras_bridge.flatten_layers(model))
    recorder.activity_regularizers = {id(layer): (layer, layer.activity_regularizer)
                                      for layer in layers}
    with recorder.active(), keras_bridge.suspended_activity_regularizers(layers), \
            keras_bridge.layer_calls_autographed():
        y_pred = model(batch.x, training=True)
    _refuse_added_losses(model)  # first: with compile(loss=None) they are its only loss
    losses, output_losses = per_example_losses(model, batch.x, batch.y, y_pred,
                                               batch.loss_weight, container=container)
    static_rows = losses.shape[0]
    penalties = activity_penalties(recorder.activity_outputs,
                                   static_rows if static_rows is not None else None)
    if penalties is not None:
        losses += penalties
    if batch.poisson_mask is not None:
        # A padding row is no example: nothing of it may reach the update, whatever the
        # compiled loss does with the mask (it weighs only that loss, through
        # sample_weight): not its activity penalty, not a compute_loss override's loss.
        losses *= tf.cast(tf.reshape(batch.poisson_mask, [-1]), losses.dtype)
    return losses, output_losses, y_pred


def record_forward(model, batch, plan, *, losses=None):
    """The Forward of one DP step: recorded forward pass, per-example and microbatch losses.

    ``losses``: the loss container to use instead of the model's compiled loss.
    """
    container = losses
    recording.instrument(model)  # layers unfrozen or added since make_private too
    if batch.poisson_mask is None:
        batch = dataclasses.replace(batch, x=microbatching.inputs_checked(
            batch.x, num_microbatches=plan.local_microbatches, multiplicity=plan.multiplicity))
    recorder = recording.Recorder(norm_hooks=plan.clipped_sum.new_hooks(), options=plan.options)
    forward_ops = ForwardOps()
    with tf.GradientTape(persistent=plan.clipped_sum.persistent_tape) as tape:
        losses, output_losses, y_pred = _losses(model, batch, plan, recorder, container)
        first_pass = computation(forward_ops.new_ops()) if plan.clipped_sum.recomputes else None
        num_microbatches, per_microbatch, losses = microbatching.microbatch_layout(
            losses, num_microbatches=plan.local_microbatches, multiplicity=plan.multiplicity,
            poisson=batch.poisson_mask is not None)
        microbatch_losses = tf.reduce_mean(tf.reshape(losses, [num_microbatches, -1]), axis=1)
        total = tf.reduce_sum(microbatch_losses)
        recorder.end_forward()
    whole_examples = refuse_cross_example_forward(recorder, batch, losses)
    plan.clipped_sum.check_forward(forward_ops)

    def recompute(after):
        x = tf.nest.map_structure(_after(after), batch.x)
        again = dataclasses.replace(batch, x=x)
        second_pass_ops = ForwardOps()
        losses, _, _ = _losses(model, again, plan, recording.Recorder(options=plan.options),
                               container)
        same_ops_as_first(computation(second_pass_ops.new_ops()), first_pass)
        return tf.reduce_mean(tf.reshape(losses, [num_microbatches, -1]), axis=1)

    return Forward(tape, recorder, y_pred, losses, output_losses, num_microbatches,
                   per_microbatch, microbatch_losses, total, recompute, whole_examples)


def _after(tensor):
    """An identity on tensors that waits for ``tensor`` (order without data dependence)."""
    def identity(t):
        if not isinstance(t, tf.Tensor):
            return t
        with tf.control_dependencies([tensor]):
            return tf.identity(t)
    return identity

