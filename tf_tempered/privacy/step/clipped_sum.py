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
"""Stage 7 of the DP step: the clipped sum Σ_m c_m·g_m, by one of three strategies.

``EngineOptions(clipped_sum=...)`` picks one; all three give the same sum:

* :class:`BookKeeping` ("bookkeeping", the default): each layer's handler forms its
  part from what its norm used (its input and output gradient, or its per-microbatch
  gradients): one backward pass, every layer's tensors kept until the last norm
  (computed inside the backward pass, as below, unless
  ``EngineOptions.norms_in_backward`` is False);
* :class:`SecondPass` ("second_pass") and :class:`Recompute` ("recompute"): a second
  backward pass, below.

Once the clip factors ``c_m = C / max(‖g_m‖, C)`` of the microbatches are known, the
clipped sum is the gradient of a reweighted loss,

    Σ_m c_m · ∇ loss_m = ∇ Σ_m stop_gradient(c_m) · loss_m,

because ``loss_m`` (the mean loss of microbatch m) depends on microbatch m's examples
only, through layers that treat examples independently (what the engine's coverage
check guarantees). The first backward pass then needs only the norms: each layer's
input and output gradient (or per-microbatch gradients) can be freed as soon as its
norm is computed, instead of being kept for the book-keeping sum until the last norm is
known. The price is one more backward pass (Li et al. 2021's ghost clipping).

The first pass computes each layer's norms inside the backward pass (:class:`~.norm_hooks.NormHooks`:
an identity on the layer's recorded output whose gradient computes them): the gradient
flows on to the layers below only once they are done, so TensorFlow's executor cannot
run the cheap input-gradient chain ahead and hold every layer's output gradient at once.

``clipped_sum="recompute"`` keeps even less: the first pass's tape is not persistent,
so each activation is freed once the first backward pass has used it (as in a
non-private step), and the reweighted loss comes from a second forward pass run after
the clip factors are known. Its gradient is the clipped sum only if the second forward
pass computes what the first did, so models that draw random numbers in their forward
pass (Dropout, GaussianNoise, random augmentation layers, random ops in custom layers)
are refused in that mode (:mod:`~.random_ops`), and so are passes that differ
(:mod:`~.second_pass_checks`).

A microbatch with a non-finite norm gets ``c_m = 0``, but ``0 · inf`` inside the second
backward pass is NaN; so when any microbatch of the step is non-finite, the step's
clipped sum is zero (noise only; ``dp_nonfinite`` reports it), where the book-keeping
sum keeps the finite microbatches. Dropping examples never increases the sensitivity.
"""

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import native as native_ops
from tf_tempered.privacy.step.norm_hooks import NormHooks
from tf_tempered.privacy.step.random_ops import refuse_random_layers, refuse_random_ops
from tf_tempered.privacy.step.second_pass_checks import (refuse_variable_writes,
                                                         same_losses_as_first)

__all__ = ["ClippedSum", "BookKeeping", "SecondPass", "Recompute", "dense_rows", "strategy_for"]


class ClippedSum:
    """The interface of the three strategies: what the step asks of the one it runs."""

    persistent_tape = False  # whether the forward pass's tape is used twice
    recomputes = False  # whether the forward pass runs again (its ops are compared)
    # Whether a layer's FusedClippedSum may replace its norms and clipped sum (only where
    # the sum is each layer's own, not a second backward pass).
    fuses_layers = False

    def new_hooks(self):
        """NormHooks that compute each layer's norms inside the backward pass, or None."""
        raise NotImplementedError

    def check_forward(self, forward_ops):
        """Refuses a forward pass this strategy cannot use (``forward_ops``: a ForwardOps)."""
        raise NotImplementedError

    def sum(self, forward, layers, weights, variables):
        """``{variable_key: Σ_m c_m·g_m}`` for the clip weights ``weights``."""
        raise NotImplementedError


class BookKeeping(ClippedSum):
    """Each layer's clipped sum from its handler (no second pass).

    With ``norms_in_backward`` each layer's norms are computed inside the backward pass
    (NormHooks), but for the recurrent layers that run their own time loop: what a layer
    keeps for its part of the sum is the same, but a layer that materializes its
    per-microbatch gradients frees its input and output gradient at once, and the
    executor cannot run the input-gradient chain ahead of the norms.
    """

    fuses_layers = True

    def __init__(self, norms_in_backward=True, native=False):
        self.norms_in_backward = norms_in_backward
        self.native = native  # EngineOptions.native: off under XLA

    def new_hooks(self):
        if not self.norms_in_backward:
            return None
        # A recurrent layer that runs its own time loop keeps the same tensors either way,
        # and its costly norms inside the backward pass would hold up the gradient of the
        # layers below it: measured slower on the LSTM classifier, no less memory
        # (benchmarks/results/norms_in_backward_time_keras3.md).
        return NormHooks(inside=lambda record: not record.handler.records_own_forward)

    def check_forward(self, forward_ops):
        del forward_ops

    def sum(self, forward, layers, weights, variables):
        del forward, variables
        summed = {}
        for layer in layers:
            grads = layer.result.clipped_sum(weights)
            for var, grad in zip(layer.variables, grads):
                if isinstance(grad, tf.IndexedSlices):
                    grad = dense_rows(grad, var.shape, native=self.native)
                key = keras_bridge.variable_key(var)
                summed[key] = summed[key] + grad if key in summed else grad
        return summed


class SecondPass(ClippedSum):
    """Norms in the first backward pass, the clipped sum from a second one on the same tape."""

    persistent_tape = True

    def __init__(self, native=False):
        self.native = native  # EngineOptions.native: how an Embedding's sum is made dense

    def new_hooks(self):
        return NormHooks()

    def check_forward(self, forward_ops):
        del forward_ops

    def sum(self, forward, layers, weights, variables):
        del layers
        return reweighted_gradients(forward.tape, forward.microbatch_losses, weights.scale,
                                    weights.finite, variables, native=self.native)


class Recompute(ClippedSum):
    """As SecondPass, with a second forward pass instead of keeping the first's activations."""

    recomputes = True

    def __init__(self, model, native=False):
        refuse_random_layers(model)
        self.native = native

    def new_hooks(self):
        return NormHooks()

    def check_forward(self, forward_ops):
        refuse_random_ops(forward_ops.new_ops())
        refuse_variable_writes(forward_ops.new_ops())

    def sum(self, forward, layers, weights, variables):
        del layers
        # The second forward pass starts only once the clip factors are known, so its
        # activations never coexist with the first pass's.
        with tf.GradientTape() as tape:
            microbatch_losses = same_losses_as_first(forward.recompute(after=weights.scale),
                                                     forward.microbatch_losses)
        return reweighted_gradients(tape, microbatch_losses, weights.scale, weights.finite,
                                    variables, native=self.native)


def dense_rows(slices, shape, *, native=False):
    """A sparse gradient (an Embedding's tf.IndexedSlices) as the dense [V, d] sum of its rows.

    The dense noise is added to every coordinate anyway. scatter_nd sums duplicate ids and
    keeps the static shape; unlike a scatter-add into tf.zeros, it gives Grappler no [V, d]
    zeros to fold into a constant the step holds. On CPU (``native``, a float32/64 sum, no
    GPU) the native op gives the same values bit for bit with the rows in parallel (text
    classifier, 50 000 × 64: 1.1 against 3.5 ms).
    """
    values, indices, shape = slices.values, slices.indices, tf.TensorShape(shape)
    if (native and values.dtype in (tf.float32, tf.float64)
            and native_ops.usable(shape.num_elements())):
        return tf.ensure_shape(native_ops.scatter_rows(indices, values, shape[0]), shape)
    return tf.scatter_nd(indices[:, None], values, shape)


def strategy_for(name, model, *, norms_in_backward=True, native=False):
    """The strategy of ``EngineOptions.clipped_sum`` ``name``."""
    if name == "bookkeeping":
        return BookKeeping(norms_in_backward, native)
    if name == "second_pass":
        return SecondPass(native)
    return Recompute(model, native)


def reweighted_gradients(tape, microbatch_losses, scale, finite, variables, *, native=False):
    """``{variable_key: Σ_m c_m ∇ loss_m}`` from a persistent ``tape`` of the forward pass
    (an Embedding's sparse gradient made dense by :func:`dense_rows`, as the book-keeping
    sum does)."""
    with tape:  # record the reweighting on the same (persistent) tape
        weighted = tf.reduce_sum(tf.stop_gradient(tf.cast(scale, microbatch_losses.dtype))
                                 * microbatch_losses)
    grads = tape.gradient(weighted, list(variables))
    all_finite = tf.reduce_all(finite > 0)
    summed = {}
    for var, grad in zip(variables, grads):
        if grad is None:  # not used in this forward pass
            continue
        if isinstance(grad, tf.IndexedSlices):  # e.g. Embedding: the dense noise goes everywhere
            grad = dense_rows(grad, var.shape, native=native)
        # A scalar zero: a zeros_like(grad) would become a constant the step holds.
        summed[keras_bridge.variable_key(var)] = tf.where(all_finite, grad, tf.zeros([], grad.dtype))
    return summed
