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
"""Stage 8 of the DP step: noise once, and the normaliser.

    ĝ = (Σ_m c_m·g_m + Z) / n,    Z ~ N(0, σ²C²·I),

with Z drawn from the model's secret key at a fresh counter (on replica 0 only under
tf.distribute, see :mod:`.replicas`) by the sampler ``EngineOptions.noise`` names, and n
the global number of microbatches, or the expected batch size q·N of Poisson batches.
The optimizer then applies ĝ (:mod:`.update`).
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import randomness

__all__ = ["noised_mean"]


def _normalizer(plan, batch, passes, stats):
    """n: the expected batch size (Poisson), else the global number of microbatches."""
    if batch.normalizer is not None:
        return batch.normalizer
    check = (plan.replicas.check_even_split(passes.rows, stats[1])
             if plan.config.num_microbatches is not None else tf.no_op())
    with tf.control_dependencies([check]):
        return tf.identity(stats[0])


def noised_mean(model, state, plan, batch, passes, summed, stats):
    """[(ĝ, variable)] for every trainable variable (a zero sum for one this step did not use,
    as TF Privacy gives it: the noise still goes to every coordinate). ``passes``: the
    Forward or chunks.Passes of the step (its ``total`` and ``rows``)."""
    normalizer = _normalizer(plan, batch, passes, stats)
    variables = model.trainable_variables
    # Drawn once the forward pass (no core taken from it) and every clipped sum are done:
    # drawn as soon as the forward pass ended, the scheduler ran the draw beside the
    # backward pass, and an Embedding's [V, d] noise coexisted with the activations (the
    # text classifier alone in a process: peak 1.30-1.33x the non-private step's, 1.13-1.18x
    # now; time unchanged, benchmarks/results/noise_after_sums_keras3.md).
    with tf.control_dependencies([passes.total, *summed.values()]):
        counter = state.noise.next_counter()  # on every replica: a synchronised step
        noises = plan.replicas.noise(
            lambda c: randomness.gaussian_noise_like(
                variables, plan.config.noise_stddev, state.noise, c, mode=plan.options.noise,
                native=plan.options.native),
            variables, counter)
    if state.audit_hook is not None:  # only in a model a privacy audit trains
        summed = state.audit_hook(dict(summed), variables, counter)
    grads_and_vars = []
    for var, noise in zip(variables, noises):
        var_dtype = tf.as_dtype(var.dtype)
        grad = summed.get(keras_bridge.variable_key(var))
        if grad is None:  # half-precision weights' sums are float32 (norms and sums exact)
            grad = tf.zeros(var.shape, tf.float32 if var_dtype.size < 4 else var_dtype)
        mean = (grad + tf.cast(noise, grad.dtype)) / tf.cast(normalizer, grad.dtype)
        # ĝ in the weight's dtype, as tape.gradient gives it: tf-keras' optimizers do not
        # cast (a float16 weight's float32 ĝ failed inside them).
        grads_and_vars.append((tf.cast(mean, var_dtype) if mean.dtype != var_dtype
                               else mean, var))
    return grads_and_vars
