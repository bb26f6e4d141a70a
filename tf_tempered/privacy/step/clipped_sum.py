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
"""Stage 5 of the DP step: the clipped sum Σ_m c_m·g_m, by one of three strategies.

``EngineOptions(clipped_sum=...)`` picks one; all three give the same sum:

* :class:`BookKeeping` ("bookkeeping", the default): each layer's handler forms its
  part from what its norm used (its input and output gradient, or its per-microbatch
  gradients): one backward pass, every layer's tensors kept until the last norm;
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

The first pass computes each layer's norms inside the backward pass (:class:`NormHooks`:
an identity on the layer's recorded output whose gradient computes them): the gradient
flows on to the layers below only once they are done, so TensorFlow's executor cannot
run the cheap input-gradient chain ahead and hold every layer's output gradient at once.

``clipped_sum="recompute"`` keeps even less: the first pass's tape is not persistent,
so each activation is freed once the first backward pass has used it (as in a
non-private step), and the reweighted loss comes from a second forward pass run after
the clip factors are known. Its gradient is the clipped sum only if the second forward
pass computes what the first did, so models that draw random numbers in their forward
pass (Dropout, GaussianNoise, random augmentation layers, random ops in custom layers)
are refused in that mode (:func:`refuse_random_layers`, :func:`refuse_random_ops`).

A microbatch with a non-finite norm gets ``c_m = 0``, but ``0 · inf`` inside the second
backward pass is NaN; so when any microbatch of the step is non-finite, the step's
clipped sum is zero (noise only; ``dp_nonfinite`` reports it), where the book-keeping
sum keeps the finite microbatches. Dropping examples never increases the sensitivity.
"""

from tf_tempered._compat import tf
from tf_tempered.privacy import keras_bridge
from tf_tempered.privacy.layer_grads import clip_weights as clip

__all__ = ["BookKeeping", "SecondPass", "Recompute", "strategy_for", "NormHooks",
           "ForwardOps", "refuse_random_layers", "refuse_random_ops"]


class BookKeeping:
    """Each layer's clipped sum from its handler (no second pass)."""

    persistent_tape = False  # the forward pass's tape is used once

    def new_hooks(self):
        """NormHooks that compute each layer's norms inside the backward pass, or None."""
        return None

    def check_forward(self, forward_ops):
        """Refuses a forward pass this strategy cannot use (Recompute: random ops)."""
        del forward_ops

    def sum(self, forward, layers, weights, variables):
        """``{variable_key: Σ_m c_m·g_m}`` of the variables the layers' handlers cover."""
        del variables
        summed = {}
        for layer in layers:
            grads = layer.norms.clipped_sum(weights)
            for var, grad in zip(layer.variables, grads):
                if isinstance(grad, tf.IndexedSlices):
                    # A sparse gradient (Embedding) is densified: the dense noise is added
                    # to every coordinate anyway. scatter_nd sums duplicate ids and keeps
                    # the static shape; unlike a scatter-add into tf.zeros, it gives
                    # Grappler no [vocab, d] zeros to fold into a constant the step holds.
                    grad = tf.scatter_nd(grad.indices[:, None], grad.values, var.shape)
                key = keras_bridge.variable_key(var)
                summed[key] = summed[key] + grad if key in summed else grad
        return summed


class SecondPass(BookKeeping):
    """Norms in the first backward pass, the clipped sum from a second one on the same tape."""

    persistent_tape = True

    def new_hooks(self):
        return NormHooks()

    def sum(self, forward, layers, weights, variables):
        del layers
        return clipped_sum(forward.tape, forward.microbatch_losses, weights.scale,
                           weights.finite, variables)


class Recompute(SecondPass):
    """As SecondPass, with a second forward pass instead of keeping the first's activations."""

    persistent_tape = False

    def __init__(self, model):
        refuse_random_layers(model)

    def check_forward(self, forward_ops):
        refuse_random_ops(forward_ops.new_ops())

    def sum(self, forward, layers, weights, variables):
        del layers
        # The second forward pass starts only once the clip factors are known, so its
        # activations never coexist with the first pass's.
        with tf.GradientTape() as tape:
            microbatch_losses = forward.recompute(after=weights.scale)
        return clipped_sum(tape, microbatch_losses, weights.scale, weights.finite, variables)


def strategy_for(name, model):
    """The strategy of ``EngineOptions.clipped_sum`` ``name``."""
    if name == "bookkeeping":
        return BookKeeping()
    if name == "second_pass":
        return SecondPass()
    return Recompute(model)


class NormHooks:
    """Per-layer norms computed in the first backward pass, one layer after the other.

    ``wrap(record, output)`` (called while recording) returns ``output`` through an
    identity whose gradient, while ``collecting`` (the first backward pass only), sets
    ``record.grad_output``, computes ``record.handler.norms(...)`` into ``norms`` and
    passes the gradient on only after them. Records of layers called more than once
    (``skip``: their norms need every call's gradient) pass the gradient straight on.
    """

    def __init__(self):
        self.step = None  # layer_grads.MicrobatchLayout, set before the first backward pass
        self.skip = set()  # ids of records whose norms are computed afterwards
        self.collecting = False
        self.norms = {}  # id(record) -> the handler's norms object

    def wrap(self, record, output):
        if not isinstance(output, tf.Tensor):
            return output

        @tf.custom_gradient
        def hook(x):
            def grad(dy):
                if not self.collecting or id(record) in self.skip:
                    return dy
                record.grad_output = clip.widen(dy)
                record.inputs = tf.nest.map_structure(clip.widen, record.inputs)
                layer_norms = record.handler.norms(record, record.params, self.step)
                self.norms[id(record)] = layer_norms
                with tf.control_dependencies([layer_norms.sq_norms]):
                    return tf.identity(dy)
            return tf.identity(x), grad

        return hook(output)


def clipped_sum(tape, microbatch_losses, scale, finite, variables):
    """``{variable_key: Σ_m c_m ∇ loss_m}`` from a persistent ``tape`` of the forward pass."""
    with tape:  # record the reweighting on the same (persistent) tape
        weighted = tf.reduce_sum(tf.stop_gradient(tf.cast(scale, microbatch_losses.dtype))
                                 * microbatch_losses)
    grads = tape.gradient(weighted, list(variables))
    all_finite = tf.reduce_all(finite > 0)
    summed = {}
    for var, grad in zip(variables, grads):
        if grad is None:  # not used in this forward pass
            continue
        if isinstance(grad, tf.IndexedSlices):  # e.g. Embedding: densify as the other path
            grad = tf.convert_to_tensor(grad)
        # A scalar zero: a zeros_like(grad) would become a constant the step holds.
        summed[keras_bridge.variable_key(var)] = tf.where(all_finite, grad, tf.zeros([], grad.dtype))
    return summed


_RECOMPUTE_FIX = ("Fix: use EngineOptions.low_memory(clipped_sum=\"second_pass\") (one forward "
                  "pass; the activations are kept for the second backward pass) or the default "
                  "EngineOptions(), or remove the random layers.")


def refuse_random_layers(model):
    """Raises ValueError if ``model`` has layers that draw random numbers when called:
    a second forward pass would not reproduce the first (clipped_sum="recompute")."""
    layers = keras_bridge.random_layers(model)
    if layers:
        _refuse("these layers draw random numbers",
                [f"{layer.name} ({type(layer).__name__})" for layer in layers])


def _refuse(what, names):
    raise ValueError(
        f"EngineOptions(clipped_sum=\"recompute\") runs the forward pass twice and needs both "
        f"to compute the same function, but {what}: {', '.join(names[:5])}. {_RECOMPUTE_FIX}")


# Op types that draw random numbers (stateful, or stateless with a seed that a layer
# advances between calls).
_RANDOM_OP_MARKERS = ("Random", "Multinomial", "TruncatedNormal", "RngReadAndSkip",
                      "RngSkip", "StatefulUniform", "StatefulStandardNormal")


class ForwardOps:
    """The ops a forward pass adds to the graph being traced.

    ``ForwardOps(traced_only=True)`` raises ValueError when the step runs eagerly
    (``run_eagerly=True``), where no op can be inspected.
    """

    def __init__(self, traced_only=False):
        if traced_only and tf.executing_eagerly():
            raise ValueError(
                "EngineOptions(clipped_sum=\"recompute\") needs a traced training step, to "
                "check that the forward pass draws no random numbers; the model was compiled "
                "with run_eagerly=True. Fix: compile without run_eagerly, or use "
                "clipped_sum=\"second_pass\".")
        self._graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        self._start = len(self._graph.get_operations()) if self._graph is not None else 0

    def new_ops(self):
        return [] if self._graph is None else self._graph.get_operations()[self._start:]


def refuse_random_ops(ops):
    """Raises ValueError if a traced forward pass draws random numbers
    (clipped_sum="recompute"; catches custom layers that call ``tf.random`` directly)."""
    random_ops = [op for op in ops if any(m in op.type for m in _RANDOM_OP_MARKERS)]
    if random_ops:
        _refuse("the forward pass draws random numbers",
                [f"{op.name} ({op.type})" for op in random_ops])
