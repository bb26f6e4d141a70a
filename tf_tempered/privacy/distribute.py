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
"""DP-SGD on R replicas (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``).

The DP engine's train step runs once per replica, on that replica's share of
the global batch. With R replicas the step computes, on replica r,

    g_r = (S_r + [r = 0]·Z) / n,    S_r = Σ_{microbatches m of replica r} clip_C(g_m),

where Z ~ N(0, σ²C²·I) is drawn by replica 0 only (from the model's secret
stream, at a counter every replica advances together, so it is the draw one
replica would make), and n is the GLOBAL normaliser: the number of microbatches
of the whole global batch (the all-reduced sum of the replicas' counts), or the
expected batch size q·N of Poisson sampling (global by construction, see
:mod:`tf_tempered.privacy.sampling`). Keras' optimizers all-reduce with SUM the
gradients handed to ``apply_gradients`` in a replica context (Keras 3:
``TFOptimizer._all_reduce_sum_gradients``; Keras 2: ``OptimizerV2``'s
``gradient_aggregator``, ``all_reduce_sum_gradients``), so every replica applies

    Σ_r g_r = (Σ_m clip_C(g_m) + Z) / n,

exactly the single-device DP-SGD update on the global batch: noise of std σ·C
once per step (not once per replica, not averaged down), one normaliser.

A microbatch never straddles replicas: with ``num_microbatches=M`` each replica
holds M/R whole microbatches, so M must be a multiple of R and every replica's
share of a batch exactly 1/R of it (checked each step; a short last batch that
tf.distribute splits unevenly is refused, drop it with ``drop_remainder=True``).

The DP metrics (``dp_clipped_fraction``, ``dp_grad_norm``, ``dp_nonfinite``,
the loss) are global: their per-step sums are all-reduced with the normaliser
(one small all-reduce), and every replica records the same global values.

With one replica every function here is the identity of the single-device step.
"""

import types

from tf_tempered._compat import KERAS_MAJOR, tf

__all__ = ["Replicas", "accept_poisson_sample_weights", "step_stats", "update_dp_metrics"]


def accept_poisson_sample_weights(model, unpack):
    """Lets ``model.compute_loss``/``compute_metrics`` take a Poisson-batch sample weight.

    Under a strategy Keras 3 builds the compiled loss and metrics before the first
    step (``_symbolic_build``) by calling them on a batch as it comes from the
    dataset, i.e. with the ``{"mask", "expected_batch_size"}`` dict of
    :func:`~tf_tempered.privacy.poisson_batches`; they are given the mask
    (``unpack(sample_weight)[0]``) instead. The DP train step passes them plain
    weights already.
    """
    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, **kwargs):
        return type(self).compute_loss(self, x, y, y_pred, unpack(sample_weight)[0], **kwargs)

    def compute_metrics(self, x, y, y_pred, sample_weight=None, **kwargs):
        return type(self).compute_metrics(self, x, y, y_pred, unpack(sample_weight)[0],
                                          **kwargs)

    model.compute_loss = types.MethodType(compute_loss, model)
    model.compute_metrics = types.MethodType(compute_metrics, model)


class Replicas:
    """The replica context of one DP train step (R = 1 outside any strategy)."""

    def __init__(self, model):
        self.count = model.distribute_strategy.num_replicas_in_sync
        self._context = tf.distribute.get_replica_context() if self.count > 1 else None
        if self.count > 1 and self._context is None:
            raise RuntimeError(
                "The DP train step ran in a cross-replica context under a strategy with "
                f"{self.count} replicas; call model.fit (it runs the step once per replica).")

    @property
    def distributed(self):
        return self.count > 1

    def check_optimizer(self, optimizer):
        """Keras 3 clips (clipnorm, ...) each replica's gradient before the all-reduce: refuse."""
        if not self.distributed or KERAS_MAJOR != 3:
            return
        for name in ("clipnorm", "clipvalue", "global_clipnorm"):
            if getattr(optimizer, name, None) is not None:
                raise ValueError(
                    f"The optimizer has {name}={getattr(optimizer, name)!r}; under a strategy "
                    f"with {self.count} replicas Keras 3 applies it to each replica's part of "
                    f"the DP gradient before summing them, which is not the single-device "
                    f"update. Drop {name} (DP-SGD already clips each example to l2_norm_clip).")

    def local_microbatches(self, num_microbatches):
        """This replica's number of microbatches (M/R), or None (one per example)."""
        if num_microbatches is None or not self.distributed:
            return num_microbatches
        if num_microbatches % self.count:
            raise ValueError(
                f"num_microbatches={num_microbatches} is not a multiple of the "
                f"{self.count} replicas: a microbatch would straddle two replicas. Use a "
                f"num_microbatches that is a multiple of {self.count}, or None (one "
                f"example per microbatch).")
        return num_microbatches // self.count

    def sum(self, values):
        """Σ over replicas of a float32 vector (identity on one replica)."""
        if not self.distributed:
            return values
        return self._context.all_reduce(tf.distribute.ReduceOp.SUM, values)

    def check_even_split(self, local_batch, global_batch):
        """An op asserting this replica holds exactly 1/R of the global batch (or no-op)."""
        if not self.distributed:
            return tf.no_op()
        return tf.debugging.assert_equal(
            tf.cast(local_batch, tf.float32) * self.count, global_batch, message=(
                f"With num_microbatches set, every one of the {self.count} replicas must "
                f"get 1/{self.count} of each batch so that no microbatch straddles two "
                f"replicas; tf.distribute split this batch unevenly (a short last batch). "
                f"Drop it: tf.data .batch(batch_size, drop_remainder=True), or a number "
                f"of examples that is a multiple of the batch size."))

    def noise(self, draw, variables, counter):
        """``draw(counter)`` on replica 0, zeros elsewhere: the noise is added once per step.

        ``counter`` must be taken (``next_counter()``) on every replica: it is a
        synchronised variable, advanced once per step.
        """
        if not self.distributed:
            return draw(counter)
        first = tf.equal(self._context.replica_id_in_sync_group, 0)
        return tf.cond(first, lambda: draw(counter),
                       lambda: [tf.zeros(v.shape, tf.float32) for v in variables])


def update_dp_metrics(metrics, global_stats, replicas):
    """Records this step's global DP metrics from :func:`step_stats`'s all-reduced sums.

    Every replica records the global values, times a share chosen so that what
    Keras reports is global: Keras 2's ``Metric.result()`` in a replica context
    sums the replicas' states (merge_call), so each records 1/R; Keras 3 reads
    each replica's own state and averages the replicas' logs, so each records
    all of it. (Means are ratios of two sums: the share cancels.)
    """
    _, _, clipped, real, norm_sum, nonfinite, loss_sum, loss_count = tf.unstack(global_stats)
    share = 1.0 / replicas.count if KERAS_MAJOR == 2 else 1.0
    safe = tf.maximum(real, 1e-30)
    metrics.clipped_fraction.update_state(clipped / safe, sample_weight=real * share)
    metrics.grad_norm.update_state(norm_sum / safe, sample_weight=real * share)
    metrics.nonfinite.update_state(nonfinite * share)
    metrics.masked_loss.update_state(loss_sum / tf.maximum(loss_count, 1e-30),
                                     sample_weight=loss_count * share)


def configure_model(model):
    """Keras 2 under MultiWorkerMirroredStrategy: report the replicas' logs as they are.

    TF-Keras reduces the per-replica logs of ``fit`` with ``distribute_reduction_method``
    "auto", which is "sum" across workers; its metric results are already global
    (``Metric.result()`` merges the replicas), so the sum would report R times the
    loss and metrics. "first" reports them once (Keras 3 averages: nothing to do).
    """
    strategy = model.distribute_strategy
    if (KERAS_MAJOR == 2 and strategy.num_replicas_in_sync > 1
            and isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
            and getattr(model, "_distribute_reduction_method", None) is None):
        model.distribute_reduction_method = "first"


def step_stats(replicas, *, num_microbatches, rows, norm, finite, clip, real, losses,
               loss_weight):
    """[microbatches, rows, clipped, real, Σ norm, non-finite, Σ loss, loss weight] summed
    over all replicas (one all-reduce): the global normaliser and DP metrics of the step.

    ``real`` weights the microbatches (0 for padded Poisson rows and non-finite
    ones), ``loss_weight`` the rows' losses (None: all 1).
    """
    losses = tf.cast(losses, tf.float32)
    weight = tf.ones_like(losses) if loss_weight is None else tf.cast(loss_weight, tf.float32)
    local = tf.stack([
        tf.cast(num_microbatches, tf.float32),
        tf.cast(rows, tf.float32),
        tf.reduce_sum(tf.cast(norm > clip, tf.float32) * real),
        tf.reduce_sum(real),
        tf.reduce_sum(tf.where(finite > 0, norm, 0.0) * real),
        tf.reduce_sum(1.0 - finite),
        tf.reduce_sum(losses * weight),
        tf.reduce_sum(weight),
    ])
    return replicas.sum(local)
