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

from tf_tempered._compat import KERAS_MAJOR, tf

__all__ = ["Replicas"]


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

    def metric_share(self):
        """The share of a global value each replica records in a Keras metric.

        Keras 2's ``Metric.result()`` in a replica context sums the replicas' states
        (merge_call), so each records 1/R; Keras 3 reads each replica's own state and
        averages the replicas' logs, so each records all of it.
        """
        return 1.0 / self.count if KERAS_MAJOR == 2 else 1.0
