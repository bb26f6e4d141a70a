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
"""Random numbers drawn in a layer's call: the generic per-example path
(:mod:`~tf_tempered.privacy.layer_grads.generic`) runs the call again, where a draw would
differ from the forward pass's, and so would the gradient. Such a layer is refused, naming
the fix.

>>> ops = tf.function(lambda t: t * tf.random.uniform([2])).get_concrete_function(
...     tf.TensorSpec([2])).graph.get_operations()
>>> [op.type for op in fresh_draws(ops)]
['RandomUniform']
"""

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["draws", "fresh_draws", "refuse_random_draws", "refuse_random_ops"]


def refuse_random_draws(layer, drawing=None):
    """The VJP runs the layer's call again: draws inside it (its dropout, noise) would differ
    from the forward pass's, and so would the gradient (wrong, silently)."""
    drawing = drawing or [f"{d.name!r} ({type(d).__name__})"
                          for d in keras_bridge.random_layers(layer)]
    if drawing:
        names = ", ".join(drawing[:3])
        raise UnsupportedLayerError(
            f"Layer {layer.name!r} ({type(layer).__name__}) takes the generic per-example "
            f"path, which runs its call again, and random numbers are drawn inside it (by "
            f"{names}): the second call would draw others than the forward pass and give "
            "another gradient (with a fixed seed too: it draws for one example, not the "
            "batch). Fix: set its dropout (or noise) to 0 and put a "
            "keras.layers.Dropout before or after the layer instead, or draw the random "
            "numbers in a layer of their own without weights.")


# Ops that draw anew at every run: TF's stateful random ops (a stateless op counts when its
# seed does, _fresh_seed: Keras 3's keras.random.*(seed=None) reads a seed state).
_RANDOM_OP_TYPES = frozenset({
    "RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
    "ParameterizedTruncatedNormal", "RandomShuffle", "Multinomial", "RandomGamma",
    "RandomPoisson", "RandomPoissonV2", "StatefulUniform", "StatefulUniformInt",
    "StatefulUniformFullInt", "StatefulStandardNormal", "StatefulStandardNormalV2",
    "StatefulTruncatedNormal", "StatefulRandomBinomial", "RngReadAndSkip", "RngSkip",
    # tf.random.*_candidate_sampler (sampled softmax's negatives; probe A2, F5) and
    # tf.image.sample_distorted_bounding_box.
    "UniformCandidateSampler", "LogUniformCandidateSampler", "LearnedUnigramCandidateSampler",
    "FixedUnigramCandidateSampler", "ThreadUnsafeUnigramCandidateSampler",
    "AllCandidateSampler", "SampleDistortedBoundingBox", "SampleDistortedBoundingBoxV2",
    "RandomCrop"})


def refuse_random_ops(layer, ops):
    """The ops one example's call traced (``ops``) draw random numbers: tf.random.*,
    tf.nn.dropout, Keras 3's keras.random.* in a custom layer, which keras_bridge.random_layers
    does not see (probe V, F1: the gradient's dropout mask differed from the forward's). A
    fixed seed draws alike twice, but not alike for one example ([1, d]) and the batch
    ([B, d]): every example but the first got another mask (probe S, F5)."""
    drawing = draws(ops)
    if drawing:
        refuse_random_draws(layer, [f"{drawing[0].type} op {drawing[0].name!r}"])


def draws(ops):
    """The ops among ``ops`` (and the functions they run) that draw random numbers, with
    whatever seed."""
    return [op for op in keras_bridge.with_function_bodies(ops)
            if op.type in _RANDOM_OP_TYPES or _is_stateless_draw(op)]


def fresh_draws(ops):
    """The ops among ``ops`` (and the functions they run) that draw other random numbers at
    every run: stateful random ops, stateless ones whose seed changes (_fresh_seed)."""
    return [op for op in keras_bridge.with_function_bodies(ops)
            if op.type in _RANDOM_OP_TYPES or (_is_stateless_draw(op) and any(
                _fresh_seed(t) for t in op.inputs if t.dtype.is_integer))]


# Stateless draws by their ops' names (StatelessRandomUniformV2, StatelessTruncatedNormalV2,
# StatelessMultinomial, StatelessParameterizedTruncatedNormal, StatelessShuffle, ...): a
# test of "Random" alone missed truncated normals and categoricals (probe S, F1).
_STATELESS_DRAWS = ("Random", "TruncatedNormal", "Multinomial", "Shuffle",
                    "SampleDistortedBoundingBox")


def _is_stateless_draw(op):
    return op.type.startswith("Stateless") and any(d in op.type for d in _STATELESS_DRAWS)


# Ops whose output is a shape or a size, not the values of their inputs: a seed computed
# from them does not change with a variable's value.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank"})


def _fresh_seed(tensor, depth=0):
    """Whether ``tensor`` (a seed) changes from run to run: read from a variable (a Keras 3
    SeedGenerator's state) or the clock, within a few ops."""
    op = tensor.op
    if op.type in ("ReadVariableOp", "VarHandleOp", "AssignAddVariableOp", "Timestamp"):
        return True
    if op.type == "Placeholder":  # a captured variable's handle inside a function body
        return tensor.dtype == tf.resource
    if op.type in _SHAPE_OPS:
        return False
    return depth < 6 and any(_fresh_seed(t, depth + 1) for t in op.inputs)
