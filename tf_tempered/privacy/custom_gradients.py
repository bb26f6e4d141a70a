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
"""Gradients a forward pass defines itself (``tf.custom_gradient``,
``keras.ops.custom_gradient``): refused in a DP step, unless TensorFlow or Keras wrote them.

The engine takes every layer's per-example gradients from the batch's one backward pass:
the gradient reaching a layer's output must be, row by row, that example's alone. TF's own
gradients of a forward pass that keeps examples apart (checked, example_rows) are; a
gradient written by hand may mix rows (``lambda u: tf.reduce_sum(u, 0) + 0 * u``), and no
check of the forward pass sees it: one example then moved the clipped sum by 4–12× the
bound (probe Z). A custom gradient is judged by the function ``tf.custom_gradient``
decorated (and what it holds): TF's and Keras' own (``tf.nn.silu``, CTC's dense loss, Keras
3's quantized Dense) pass; one with any other code is refused, wherever it is called (an
``activation=`` of a Keras Dense, a user's RNN cell: probe S, F2), whatever gradient it
returns (TF's ``tf.math.cumsum`` too: probe A2, F1). The engine's own hooks (the norms' taps, the loss-rows check) carry
:data:`ENGINE_SCOPE` in their names and are left out.

>>> @tf.custom_gradient
... def doubled_gradient(x):
...     return tf.identity(x), lambda u: 2.0 * u
>>> graph = tf.function(doubled_gradient).get_concrete_function(tf.TensorSpec([2])).graph
>>> [op.type for op in user_custom_gradients(graph.get_operations())]
['IdentityN']
>>> graph = tf.function(tf.nn.silu).get_concrete_function(tf.TensorSpec([2])).graph
>>> user_custom_gradients(graph.get_operations())  # TF's own: row by row
[]
"""

from tf_tempered import keras_bridge
from tf_tempered._compat import tf
from tf_tempered.privacy.errors import UnsupportedLayerError

__all__ = ["ENGINE_SCOPE", "refuse_custom_gradients", "user_custom_gradients"]

ENGINE_SCOPE = "tf_tempered_engine"  # the name scope of the engine's own custom gradients

keras_bridge.record_custom_gradients()


def user_custom_gradients(ops):
    """The ops among ``ops`` (and the functions they run) whose gradient is a custom one
    made neither by the engine nor by TF's or Keras' own code alone."""
    return [op for op in keras_bridge.with_function_bodies(ops)
            if "_gradient_op_type" in op.node_def.attr
            and op.get_attr("_gradient_op_type").startswith(b"CustomGradient")
            and ENGINE_SCOPE not in op.name and not _library_code_only(op)]


def _library_code_only(op):
    files = keras_bridge.custom_gradient_code(op)
    return bool(files) and all(keras_bridge.is_library_file(f) for f in files)


def refuse_custom_gradients(forward_ops):
    """Raises UnsupportedLayerError naming the first custom gradient of a traced forward
    pass (``forward_ops``: the ops it added) that runs code of neither TF nor Keras. Eager
    steps (run_eagerly=True) have no ops to read: not checked there."""
    if tf.executing_eagerly() or not forward_ops:
        return
    found = user_custom_gradients(forward_ops)
    if found:
        raise UnsupportedLayerError(
            f"The model's forward pass (or its loss) defines its own gradient "
            f"(tf.custom_gradient or keras.ops.custom_gradient: op {found[0].name!r}). The "
            "DP engine takes each example's gradient from the batch's backward pass, and a "
            "gradient written by hand can mix the batch's examples (a sum over the batch), "
            "which no check of the forward pass sees: one example would move the clipped sum "
            "by more than the bound the ε assumes. Fix: compute it with TensorFlow's own "
            "gradients (the same forward pass without custom_gradient; for a straight-through "
            "estimator, x + tf.stop_gradient(f(x) - x)).")
