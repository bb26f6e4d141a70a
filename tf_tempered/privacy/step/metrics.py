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
"""Stage 9 of the DP step: the DP metrics and the logs Keras reports.

``dp_clipped_fraction`` (share of microbatches whose gradient was clipped),
``dp_grad_norm`` (their mean norm before clipping), ``dp_nonfinite`` (microbatches
dropped for a non-finite gradient) and the ``loss``: the mean loss of the real rows
(padded Poisson rows and the examples counted in ``dp_nonfinite`` left out), and each
output's loss for a model with several. All are global under tf.distribute: the
step's sums are all-reduced in one vector with the normaliser.
"""

from tf_tempered._compat import keras, tf
from tf_tempered.privacy.layer_grads import clip_weights as clip_lib
from tf_tempered import keras_bridge
from tf_tempered.privacy import microbatching

__all__ = ["DPMetrics", "local_stats", "update_metrics", "update_compiled_metrics",
           "step_logs"]


class DPMetrics:
    """The DP training metrics reported in the history (kept out of ``model.metrics``, so
    that evaluate() does not report them; reset with the model's metrics each epoch)."""

    def __init__(self):
        self.clipped_fraction = keras.metrics.Mean(name="dp_clipped_fraction")
        self.grad_norm = keras.metrics.Mean(name="dp_grad_norm")
        self.nonfinite = keras.metrics.Sum(name="dp_nonfinite")
        # Keras' loss tracker averages over all rows, padded Poisson rows included.
        self.masked_loss = keras.metrics.Mean(name="loss")

    def all(self):
        return [self.clipped_fraction, self.grad_norm, self.nonfinite, self.masked_loss]


def _row_weights(batch, forward, finite):
    """[rows] weight of each row's loss in the reported loss: 0 for padding and for the
    rows of non-finite microbatches."""
    rows_finite = tf.reshape(clip_lib.per_example(finite, forward.losses), [-1])
    if batch.poisson_mask is None:
        return rows_finite
    return tf.cast(batch.poisson_mask, tf.float32) * rows_finite


def local_stats(plan, batch, forward, norm, finite):
    """This replica's sums (of one chunk, with EngineOptions.physical_batch_size), which the
    step all-reduces once (``plan.replicas.sum``):
    [microbatches, rows, clipped, real, Σ norm, non-finite, Σ w·loss, Σ w, Σ w·loss_k...]."""
    members = tf.ones_like(finite)
    if batch.poisson_mask is not None:  # padded rows are not examples: leave them out
        members = microbatching.microbatch_mask(batch.poisson_mask, forward.num_microbatches)
    real = finite * members
    weight = _row_weights(batch, forward, finite)

    def weighted_sum(losses):  # NaN · 0 would be NaN: select, do not multiply
        return tf.reduce_sum(tf.where(weight > 0, tf.cast(losses, tf.float32), 0.0) * weight)

    clip = tf.constant(plan.config.l2_norm_clip, tf.float32)
    return tf.stack([
        tf.cast(forward.num_microbatches, tf.float32),
        tf.cast(tf.shape(forward.losses)[0], tf.float32),
        tf.reduce_sum(tf.cast(norm > clip, tf.float32) * real),
        tf.reduce_sum(real),
        tf.reduce_sum(tf.where(finite > 0, norm, 0.0) * real),
        tf.reduce_sum((1.0 - finite) * members),  # a padding row's NaN is no example's
        weighted_sum(forward.losses),
        tf.reduce_sum(weight),
        *[weighted_sum(losses) for losses in forward.output_losses],
    ])


def update_metrics(model, metrics, stats, replicas):
    """Records this step's global DP metrics and losses (every replica the global values,
    times the replicas' metric share; means are ratios of two sums: the share cancels),
    and the per-output losses of ``model``'s compiled loss (None: none to update)."""
    _, _, clipped, real, norm_sum, nonfinite, loss_sum, count, *output_sums = tf.unstack(stats)
    share = replicas.metric_share()
    safe = tf.maximum(real, 1e-30)
    metrics.clipped_fraction.update_state(clipped / safe, sample_weight=real * share)
    metrics.grad_norm.update_state(norm_sum / safe, sample_weight=real * share)
    metrics.nonfinite.update_state(nonfinite * share)
    positive = tf.maximum(count, 1e-30)
    metrics.masked_loss.update_state(loss_sum / positive, sample_weight=count * share)
    trackers = keras_bridge.compiled_loss_trackers(model) if model is not None else []
    if len(trackers) == len(output_sums):
        for tracker, total in zip(trackers, output_sums):
            if tracker is not None:
                tracker.update_state(total / positive, sample_weight=count * share)


def update_compiled_metrics(model, batch, y_pred, *, in_loop=False):
    """Updates the compiled metrics on the real rows; returns Keras' logs of them (None
    ``in_loop``: a chunk's update inside the step's loop, the logs read after it)."""
    x, y, weight = batch.x, batch.y, batch.loss_weight
    if batch.poisson_mask is not None:
        # Padded rows are not examples. Keras applies sample weights to
        # `weighted_metrics` only, so drop the rows for the compiled metrics.
        keep = tf.greater(batch.poisson_mask, 0)
        real_rows = lambda t: tf.boolean_mask(t, keep)  # noqa: E731
        weight = (None if batch.user_weight is None
                  else tf.nest.map_structure(real_rows, batch.user_weight))
        y, y_pred = tf.nest.map_structure(real_rows, y), tf.nest.map_structure(real_rows, y_pred)
    if in_loop:
        keras_bridge.update_metrics_state(model, x, y, y_pred, weight)
        return None
    return model.compute_metrics(x, y, y_pred, weight)


def step_logs(model, metrics, batch, y_pred):
    """The logs of the step: the compiled metrics on the real rows, the loss, the DP metrics.

    ``y_pred`` None: the compiled metrics were updated chunk by chunk (physical_batch_size).
    """
    if y_pred is None:
        logs = dict(model.get_metrics_result())
    else:
        logs = update_compiled_metrics(model, batch, y_pred)
    logs["loss"] = metrics.masked_loss.result()
    logs.update({m.name: m.result() for m in metrics.all() if m is not metrics.masked_loss})
    return logs
