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
"""DPGradients: the DP-SGD gradient of a batch, for custom training loops.

The same stages as a private model's ``fit`` (:mod:`tf_tempered.privacy.step`), the same
secret noise key, coverage checks and refusals; only the update goes back to the caller:

    ĝ = (Σ_m clip_C(g_m) + N(0, σ²C²·I)) / n

aligned with ``model.trainable_variables`` (n: the number of microbatches, or the expected
batch size of a Poisson batch), plus the DP metrics. Use it inside your own
``tf.function``; under ``strategy.run`` apply ``ĝ`` with a Keras optimizer inside the
replica function (it sums the replicas' parts, as in ``fit``: noise is drawn once).

Accounting: the steps it takes are recorded in the model's privacy ledger as steps on
batches the engine did not draw (no amplification by subsampling), which is valid
whatever the batches were; ``tf_tempered.privacy.epsilon_spent(model)`` reports them. For
Poisson batches (:func:`~tf_tempered.privacy.poisson_batches`) the smaller, amplified ε is
``compute_epsilon(num_examples=N, batch_size=q·N, steps=<steps>, sampling="poisson")``.

>>> import numpy as np
>>> from tf_tempered._compat import keras
>>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
>>> dp = DPGradients(model, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
...                  l2_norm_clip=1.0, noise_multiplier=1.1)
>>> optimizer = keras.optimizers.SGD(0.1)
>>> @tf.function
... def step(x, y):
...     grads, logs = dp(x, y)
...     optimizer.apply_gradients(zip(grads, model.trainable_variables))
...     return logs
>>> logs = step(np.ones((4, 3), np.float32), np.zeros(4))
>>> sorted(logs)
['dp_clipped_fraction', 'dp_grad_norm', 'dp_nonfinite', 'loss']
"""

from tf_tempered._compat import KERAS_MAJOR, tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import dp_outputs, shared_ledgers, update_guard
from tf_tempered.privacy.fit_in_progress import refuse_during_own_fit
from tf_tempered.privacy.make_private import make_private, training_overrides_allowed
from tf_tempered.privacy.state import get_state
from tf_tempered.privacy.step.keras_step import dp_gradients

__all__ = ["DPGradients"]


class DPGradients:
    """The noised mean of clipped per-example gradients of ``model`` on a batch.

    Args:
      model: a Keras model (make_private is called on it with the settings below).
      loss: any Keras loss (a name, a loss object with any reduction, a function returning
        one loss per example, a dict/list for several outputs); None: the model's compiled
        loss.
      l2_norm_clip, noise_multiplier, num_microbatches: DP-SGD's C, σ and microbatches.
      loss_weights, options, insecure_dp_seed, delta, accountant: as for compile and
        :func:`~tf_tempered.privacy.make_private`.

    ``dp(x, y, sample_weight=None)`` returns ``(grads, logs)``: one gradient per variable of
    ``model.trainable_variables`` (a zero sum plus noise for a variable the batch did not
    use) and the DP metrics of the batch. ``sample_weight`` may be a Poisson batch's info
    dict (``poisson_batches`` yields ``(x, y, info)``).
    """

    def __init__(self, model, loss=None, *, l2_norm_clip, noise_multiplier,
                 num_microbatches=None, loss_weights=None, options=None, insecure_dp_seed=None,
                 delta=None, accountant=None):
        with training_overrides_allowed():  # e.g. called from the model's own train_step
            make_private(model, l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                         num_microbatches=num_microbatches, options=options,
                         insecure_dp_seed=insecure_dp_seed, delta=delta, accountant=accountant)
        update_guard.allow_dp_gradient_loops(model)  # the loop's optimizer applies these
        self.model = model
        if loss is None:
            if not keras_bridge.has_compiled_loss(model):
                raise ValueError("DPGradients needs a loss: pass loss=... (any Keras loss), "
                                 "or compile the model with one first.")
            self._losses = None
        else:
            self._losses = keras_bridge.loss_container(model, loss, loss_weights)

    @property
    def state(self):
        """The model's PrivateState (settings, noise key, metrics, ledger)."""
        return get_state(self.model)

    def __call__(self, x, y, sample_weight=None):
        data = (x, y) if sample_weight is None else (x, y, sample_weight)
        data = tf.nest.map_structure(tf.convert_to_tensor, data)  # (NumPy arrays, eagerly)
        _refuse_cross_replica_call(self.model)
        refuse_during_own_fit(self.model, "a DPGradients step")
        _, _, update = dp_gradients(self.model, data, losses=self._losses)
        update_guard.allow_dp_gradient_loops(self.model)  # weights built by this call too
        shared_ledgers.merge_new_weights(self.model)
        metrics = self.state.metrics
        logs = {m.name: m.result() for m in metrics.all()}
        grads = [grad for grad, _ in update]
        dp_outputs.register(grads)  # what an optimizer may apply to the model (update_guard)
        return grads, logs

    def reset_metrics(self):
        """Resets the DP metrics (they average over the batches since the last reset)."""
        for metric in self.state.metrics.all():
            metric.reset_state()


def _refuse_cross_replica_call(model):
    """A call in a strategy's scope outside strategy.run reads distributed variables whole,
    which TF refuses deep inside the step ("DistributedVariable.handle is not available
    outside the replica context"); tf-keras' metrics of a model made under a strategy of
    several replicas are updated only in a replica context (it failed inside them with a
    SyncOnReadVariable error)."""
    strategy = model.distribute_strategy
    context = tf.distribute.get_replica_context()  # None in the strategy's cross-replica scope
    if context is None or (KERAS_MAJOR == 2 and strategy.num_replicas_in_sync > 1
                           and context.strategy is not strategy):
        raise ValueError(
            f"DPGradients called outside strategy.run (in a strategy's scope, or on a model "
            f"made under a strategy of {strategy.num_replicas_in_sync} replicas on Keras 2). "
            "Fix: call it inside the "
            "replica function, strategy.run(step, args=(x, y)), with each replica's batch "
            "(strategy.experimental_distribute_dataset or distributed_poisson_batches), and "
            "apply the gradients there (docs/custom_loops.md).")
