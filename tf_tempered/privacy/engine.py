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
"""Fast, exact DP-SGD for Keras models compiled with a DP optimizer.

`make_private(model)` hooks the model's training step. When the model is compiled
with one of tf_tempered's DP optimizers (`tf_tempered.privacy.DPKerasSGDOptimizer`,
`DPKerasAdamOptimizer`, `DPKerasAdagradOptimizer`: TF Privacy's names and
arguments, any Python) or one of TF Privacy's Keras DP optimizers (DPKeras*,
GenericDP* with a Gaussian query, VectorizedDPKeras*; Python <= 3.11), each step
computes per-microbatch gradient norms with
one backward pass (each layer's handler in `tf_tempered.privacy.layer_grads`), clips them to the
optimizer's `l2_norm_clip`, adds N(0, (σ·C)²) to the sum (keyed by a secret, see
`tf_tempered.privacy.randomness`: the global seed does not fix it), divides by the
number of microbatches, and hands the result to the optimizer's own update rule
(SGD, Adam, ...), exactly as TF Privacy's own slow `_compute_gradients` would. With any
other optimizer the model trains as usual (non-privately). Under a tf.distribute
MirroredStrategy or MultiWorkerMirroredStrategy each replica clips its own examples and
the update is still the single-device one (noise once, global normaliser): see
`tf_tempered.privacy.distribute`.

Example:

>>> from tf_tempered._compat import keras
>>> from tf_tempered.privacy import DPKerasSGDOptimizer, make_private
>>> model = make_private(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]))
>>> model.compile(
...     optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
...                                   learning_rate=0.1),
...     loss=keras.losses.SparseCategoricalCrossentropy(
...         from_logits=True, reduction="none"))
>>> history = model.fit(np.zeros((8, 4)), np.zeros(8), batch_size=4, verbose=0)
>>> sorted(k for k in history.history if k.startswith("dp_"))
['dp_clipped_fraction', 'dp_grad_norm', 'dp_nonfinite']
"""

import logging
import types

import numpy as np  # noqa: F401 (the module docstring's example uses it)

from tf_tempered._compat import check_same_keras, keras, tf
from tf_tempered.privacy import (coverage, distribute, keras_bridge, layer_grads, layer_report,
                                 microbatching, randomness, recording, second_pass)
from tf_tempered.privacy.clip import ClipWeights
from tf_tempered.privacy.options import EngineOptions
from tf_tempered.privacy.settings import DPConfig, dp_config, model_dp_config, settings_config

__all__ = ["DPConfig", "EngineOptions", "dp_config", "make_private", "is_private",
           "has_secret_dp_randomness", "UnsupportedLayerError"]

UnsupportedLayerError = recording.UnsupportedLayerError

_LOG = logging.getLogger(__name__)

def is_private(model):
    """True if `make_private` has prepared `model` for the fast DP engine."""
    return getattr(model, "_tf_tempered_private", False)


def has_secret_dp_randomness(model):
    """True if the DP noise of ``model`` (prepared by make_private) is keyed by a secret.

    False for ``make_private(model, insecure_dp_seed=K)``, whose ε does not hold.
    Raises ValueError for a model that make_private has not prepared.
    """
    if not is_private(model):
        raise ValueError(
            f"model {getattr(model, 'name', model)!r} was not prepared by make_private, so "
            "tf_tempered does not draw its DP noise (TF Privacy's own DP path draws it "
            "from TensorFlow's global seed). Call tf_tempered.make_private(model) first.")
    return model._dp_noise.is_secret  # pylint: disable=protected-access


def make_private(model, *, l2_norm_clip=None, noise_multiplier=None, num_microbatches=None,
                 insecure_dp_seed=None, options=None, augmentation_multiplicity=1):
    """Prepares a Keras model for fast, exact DP-SGD and returns it (the same object).

    Works for Sequential, Functional and subclassed models of the active Keras
    (Keras 3 by default, Keras 2 with ``TF_USE_LEGACY_KERAS=1``) whose trainable
    layers treat examples independently. Two ways to give the DP-SGD settings:

    * ``make_private(model, l2_norm_clip=C, noise_multiplier=σ, num_microbatches=None)``,
      then compile with any Keras optimizer (SGD, Adam, AdamW, learning-rate
      schedules): it applies the DP gradient with its own update rule;
    * ``make_private(model)``, then compile with a DP optimizer that carries them
      (``tf_tempered.privacy.DPKerasSGDOptimizer``/``DPKerasAdamOptimizer``/
      ``DPKerasAdagradOptimizer``, or TF Privacy's on Keras 2, Python <= 3.11).
      Compiled with a plain optimizer instead, such a model trains non-privately.

    Either way compile with a per-example loss (``reduction="none"``); `fit` then
    runs DP-SGD: per-microbatch gradients clipped to C, N(0, (σ·C)²) noise added
    to their sum once, divided by the number of microbatches (or the expected
    batch size of Poisson batches). Training history gains `dp_clipped_fraction` (fraction of
    microbatches whose gradient was clipped), `dp_grad_norm` (their mean
    gradient norm before clipping) and `dp_nonfinite` (microbatches dropped for a
    NaN/inf gradient; they contribute zero).

    The noise is keyed by a secret drawn from the OS's entropy when this is
    called, never by ``keras.utils.set_random_seed`` or ``tf.random.set_seed``
    (those still control weight initialisation, dropout, shuffling): see
    :mod:`tf_tempered.privacy.randomness`. ``insecure_dp_seed=K`` (an int) makes
    the noise a function of K instead: reproducible for debugging and tests, NOT
    private (the ε does not hold; warns). Calling make_private again re-keys.

    ``options`` (an :class:`~tf_tempered.privacy.options.EngineOptions`, default
    ``EngineOptions()``) chooses how per-microbatch norms and clipped sums are
    computed (native op, ghost norm, materialized gradients, chunk sizes); every
    choice gives the same update, so they trade speed and memory only. Calling
    make_private again replaces them.

    ``augmentation_multiplicity=K`` (De et al. 2022): every batch holds K
    consecutive augmented copies of each example (build them with
    :func:`tf_tempered.augment.augmult_batches`); an example's gradient is the mean
    over its copies, clipped once, so sensitivity, normaliser and ε are those of
    per-example clipping (:mod:`tf_tempered.privacy.microbatching`).

    Several devices or machines: build the model, call make_private and compile in
    ``strategy.scope()`` (``MirroredStrategy``, ``MultiWorkerMirroredStrategy``); each
    step then gives the single-device update on the global batch
    (:mod:`tf_tempered.privacy.distribute`; Poisson batches from
    :func:`~tf_tempered.privacy.sampling.distributed_poisson_batches`).

    Raises UnsupportedLayerError (a ValueError) for layers that mix examples,
    such as a trainable BatchNormalization, and ValueError for invalid settings
    (naming the argument).
    """
    check_same_keras(model, "make_private's model")
    if not isinstance(model, keras.Model):
        raise TypeError(f"make_private expects a keras.Model, got {type(model).__name__}.")
    config = settings_config(l2_norm_clip=l2_norm_clip, noise_multiplier=noise_multiplier,
                             num_microbatches=num_microbatches)
    augmentation_multiplicity = microbatching.validate_multiplicity(augmentation_multiplicity)
    if options is None:
        options = EngineOptions()
    elif not isinstance(options, EngineOptions):
        raise TypeError(f"make_private: options must be a tf_tempered.privacy.EngineOptions, "
                        f"got {type(options).__name__}.")
    if options.clipped_sum == "recompute":
        second_pass.refuse_random_layers(model)
    with model.distribute_strategy.scope():  # replicated variables under a strategy
        noise = randomness.DPRandomness("noise", insecure_dp_seed=insecure_dp_seed)
        dp_metrics = None if is_private(model) else _DPMetrics()
    recording.instrument(model)
    if not is_private(model):
        keras_bridge.set_untracked(model, "_tf_tempered_private", True)
        # Kept out of model.metrics so evaluate() does not report them; reset
        # with the model's own metrics at the start of every epoch.
        keras_bridge.set_untracked(model, "_dp_metrics", dp_metrics)
        model.train_step = types.MethodType(_train_step, model)
        distribute.accept_poisson_sample_weights(model, _unpack_sample_weight)
        distribute.configure_model(model)
        model.reset_metrics = types.MethodType(_reset_metrics, model)
    # Untracked, like _dp_metrics: the key is in no weight list, checkpoint or
    # saved model.
    keras_bridge.set_untracked(model, "_dp_noise", noise)
    keras_bridge.set_untracked(model, "_dp_options", options)
    keras_bridge.set_untracked(model, "_dp_settings", config)
    keras_bridge.set_untracked(model, "_dp_augmult", augmentation_multiplicity)
    keras_bridge.set_untracked(model, "_dp_generic_logged", False)
    model.train_function = None  # drop a step compiled before this call (old key)
    return model


class _DPMetrics:
    """The DP training metrics reported in the history."""

    def __init__(self):
        self.clipped_fraction = keras.metrics.Mean(name="dp_clipped_fraction")
        self.grad_norm = keras.metrics.Mean(name="dp_grad_norm")
        self.nonfinite = keras.metrics.Sum(name="dp_nonfinite")
        # Keras' loss tracker averages over all rows, padded Poisson rows included.
        self.masked_loss = keras.metrics.Mean(name="loss")

    def all(self):
        return [self.clipped_fraction, self.grad_norm, self.nonfinite, self.masked_loss]


def _reset_metrics(self):
    type(self).reset_metrics(self)
    for metric in self._dp_metrics.all():
        metric.reset_state()


def _unpack_sample_weight(sample_weight):
    """(weights for the loss, normalizer override) from a plain or Poisson sample weight."""
    if isinstance(sample_weight, dict):
        if set(sample_weight) != {"mask", "expected_batch_size"}:
            raise ValueError(
                "A dict sample weight must be the Poisson-batch structure "
                "{'mask', 'expected_batch_size'} from tf_tempered.privacy.poisson_batches; "
                f"got keys {sorted(sample_weight)}.")
        return sample_weight["mask"], sample_weight["expected_batch_size"]
    return sample_weight, None


# Not autograph-converted: the step has no data-dependent Python control flow, and
# conversion would re-wrap our own exception types in StagingError.
@tf.autograph.experimental.do_not_convert
def _train_step(self, data):
    config = _step_config(self)
    x, y, sample_weight = keras_bridge.unpack_x_y_sample_weight(data)
    sample_weight, normalizer = _unpack_sample_weight(sample_weight)
    poisson_mask = sample_weight if normalizer is not None else None
    if config is None:
        return type(self).train_step(self, (x, y, sample_weight) if sample_weight is not None else (x, y))
    # Under a strategy: this replica's share of the batch (see distribute.py).
    replicas = distribute.Replicas(self)
    replicas.check_optimizer(self.optimizer)
    multiplicity = getattr(self, "_dp_augmult", 1)
    if multiplicity > 1 and replicas.distributed:
        raise ValueError(
            f"augmentation_multiplicity={multiplicity} is not supported under a "
            "tf.distribute strategy with several replicas yet (a replica's share of the "
            "batch could split an example's copies). Fix: train on one replica, or call "
            "make_private without augmentation_multiplicity.")
    if self.losses:
        raise ValueError(
            "The model has regularization losses (e.g. kernel_regularizer); the fast "
            "DP engine does not fold data-independent penalties into per-example "
            "gradients. Remove the regularizers (use weight decay in the optimizer, "
            "or rely on clipping and noise), or train without make_private with TF "
            "Privacy's own optimizer (Keras 2 with TF_USE_LEGACY_KERAS=1, Python <= 3.11).")
    # clipped_sum="second_pass": norms inside the first backward pass, and the tape is
    # used again for the reweighted loss; "recompute": the same norms, and a second
    # forward pass for the reweighted loss.
    recompute = self._dp_options.clipped_sum == "recompute"
    two_passes = recompute or self._dp_options.clipped_sum == "second_pass"
    if recompute:
        second_pass.refuse_random_layers(self)
    hooks = second_pass.NormHooks() if two_passes else None
    recorder = recording.Recorder(norm_hooks=hooks)
    forward_ops = second_pass.ForwardOps(traced_only=recompute)
    with tf.GradientTape(persistent=two_passes and not recompute) as tape:
        with recorder.active():
            y_pred = self(x, training=True)
        losses = self.compute_loss(x, y, y_pred, sample_weight)
        num_microbatches, examples_per_microbatch = microbatching.microbatch_layout(
            losses, num_microbatches=replicas.local_microbatches(config.num_microbatches),
            multiplicity=multiplicity, poisson=normalizer is not None)
        microbatch_losses = tf.reduce_mean(tf.reshape(losses, [num_microbatches, -1]), axis=1)
        total = tf.reduce_sum(microbatch_losses)
        recorder.end_forward()
    if recompute:
        second_pass.refuse_random_ops(forward_ops.new_ops())

    records = recorder.records
    unrecorded = coverage.check(self, records)
    coverage.refuse_reads_outside_calls(recorder)
    outputs = [r.output for r in records]
    static_batch = losses.shape[0]
    step = layer_grads.Step(num_microbatches, examples_per_microbatch, self._dp_options,
                            static_batch if static_batch is not None else tf.shape(losses)[0])
    # One entry per layer: its handler for one call; the per-example sum of the
    # calls' contributions for a layer called more than once (shared weights).
    groups = layer_grads.multi_call.group_calls(records)
    if hooks is not None:
        hooks.step, hooks.collecting = step, True
        hooks.skip = {id(call) for _, calls in groups if len(calls) > 1 for call in calls}
    # One backward pass (the tape is not persistent) for the recorded outputs and
    # the variables no recorded call covers; the latter only to see, while
    # tracing, whether the loss depends on them (their gradient ops are unused).
    grads = tape.gradient(total, outputs + [var for var, _ in unrecorded])
    coverage.refuse_unrecorded_dependencies(self, unrecorded, grads[len(outputs):])
    for record, output, g in zip(records, outputs, grads):
        # A structure for a recurrent layer returning [output, *states].
        record.grad_output = tf.nest.map_structure(
            lambda o, d: tf.zeros_like(o) if d is None else d, output, g)
    # Work on the recorded inputs (patches, transposes) and the noise draw need
    # no gradients; held until the forward pass is done, they do not take cores
    # from its convolutions.
    with tf.control_dependencies([total]):
        for record in records:
            record.inputs = tf.nest.map_structure(tf.identity, record.inputs)

    _log_generic_layers(self, records)
    records = [first for first, _ in groups]
    if hooks is not None:
        hooks.collecting = False  # the second pass must not compute norms again
    norms = [hooks.norms[id(first)] if hooks is not None and id(first) in hooks.norms
             else first.handler.norms(first, first.params, step) if len(calls) == 1
             else layer_grads.multi_call.multi_call_norms(calls, step)
             for first, calls in groups]
    layer_report.remember(self, groups, norms)
    sq_norm = tf.zeros([num_microbatches], tf.float32)
    for layer_norms in norms:
        sq_norm += tf.cast(layer_norms.sq_norms, tf.float32)
    norm = tf.sqrt(sq_norm)
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    clip = tf.constant(config.l2_norm_clip, tf.float32)
    # TF Privacy's clip_by_global_norm: scale = C / max(‖g‖, C).
    scale = tf.where(finite > 0, clip / tf.maximum(tf.where(finite > 0, norm, clip), clip), 0.0)

    summed = {}
    weights = ClipWeights(scale, finite)
    if recompute:
        summed = second_pass.recomputed_clipped_sum(
            self, x, y, sample_weight, scale, finite, num_microbatches, self.trainable_variables)
        records = norms = []
    elif two_passes:
        summed = second_pass.clipped_sum(tape, microbatch_losses, scale, finite,
                                         self.trainable_variables)
        records = norms = []  # nothing kept per layer for a book-keeping sum
    for record, layer_norms in zip(records, norms):
        variables = layer_norms.variables
        if variables is None:
            variables = record.handler.variables(record.layer, record.params)
        for var, grad in zip(variables, layer_norms.clipped_sum(weights)):
            if isinstance(grad, tf.IndexedSlices):
                # A sparse gradient (Embedding) is densified: the dense noise is
                # added to every coordinate anyway. scatter_nd sums duplicate ids and
                # keeps the static shape; unlike a scatter-add into tf.zeros, it gives
                # Grappler no [vocab, d] zeros to fold into a constant the step holds
                # for good.
                grad = tf.scatter_nd(grad.indices[:, None], grad.values, var.shape)
            key = keras_bridge.variable_key(var)
            summed[key] = summed[key] + grad if key in summed else grad

    real = finite
    if poisson_mask is not None:  # padded rows are not examples: leave them out
        real *= microbatching.microbatch_mask(poisson_mask, num_microbatches)
    stats = distribute.step_stats(  # summed over replicas
        replicas, num_microbatches=num_microbatches, rows=tf.shape(losses)[0], norm=norm,
        finite=finite, clip=clip, real=real, losses=losses, loss_weight=poisson_mask)
    if normalizer is None:  # the global number of microbatches
        check = (replicas.check_even_split(tf.shape(losses)[0], stats[1])
                 if config.num_microbatches is not None else tf.no_op())
        with tf.control_dependencies([check]):
            normalizer = tf.identity(stats[0])
    variables = self.trainable_variables
    with tf.control_dependencies([total]):
        counter = self._dp_noise.next_counter()  # on every replica: a synchronised step
        noises = replicas.noise(
            lambda c: randomness.gaussian_noise_like(variables, config.noise_stddev,
                                                     self._dp_noise, c),
            variables, counter)
    grads_and_vars = []
    for var, noise in zip(variables, noises):
        grad = summed.get(keras_bridge.variable_key(var))
        if grad is None:  # not used in this forward pass: TF Privacy's zero gradient
            grad = tf.zeros_like(var)
        grads_and_vars.append(((grad + tf.cast(noise, grad.dtype)) / tf.cast(normalizer, grad.dtype), var))

    if hasattr(self.optimizer, "_was_dp_gradients_called"):  # a DP optimizer: mark the call
        self.optimizer._was_dp_gradients_called = True  # pylint: disable=protected-access
    self.optimizer.apply_gradients(grads_and_vars)

    metrics = self._dp_metrics
    # Global (all-replica) DP metrics and loss; Keras 3's compute_loss does not
    # feed its loss tracker (its train_step does), and Keras' mean would count
    # padded Poisson rows.
    distribute.update_dp_metrics(metrics, stats, replicas)
    if poisson_mask is None:
        logs = self.compute_metrics(x, y, y_pred, sample_weight)
    else:
        # Padded rows are not examples. Keras applies sample weights to
        # `weighted_metrics` only, so drop the rows for the compiled metrics.
        keep = tf.greater(poisson_mask, 0)
        real_rows = lambda t: tf.boolean_mask(t, keep)
        logs = self.compute_metrics(x, tf.nest.map_structure(real_rows, y),
                                    tf.nest.map_structure(real_rows, y_pred), None)
    logs["loss"] = metrics.masked_loss.result()
    logs.update({m.name: m.result() for m in metrics.all() if m is not metrics.masked_loss})
    return logs


def _step_config(model):
    """The DPConfig of this step: make_private's settings, else the optimizer's, else None."""
    check_same_keras(model.optimizer, "The compiled optimizer")
    return model_dp_config(model)


def _log_generic_layers(model, records):
    """Logs once per model (at the first trace) which layers take the generic VJP fallback."""
    if getattr(model, "_dp_generic_logged", True):
        return
    keras_bridge.set_untracked(model, "_dp_generic_logged", True)
    names = [f"{r.layer.name} ({type(r.layer).__name__})" for r in records
             if r.handler is layer_grads.GENERIC or r.handler.vjp_of_own_call]
    if names:
        _LOG.info("tf_tempered: per-example gradients by the generic per-layer VJP (no "
                  "handler of their own; a recurrent layer as one unit) for: %s",
                  ", ".join(names))

