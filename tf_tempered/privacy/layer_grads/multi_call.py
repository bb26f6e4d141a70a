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
"""A layer called more than once in one forward pass: the per-example sum of its calls.

A shared layer (one Dense applied to two inputs, a siamese tower) and the layer
inside Keras 3's TimeDistributed (called once per time step) use the same
weights in several calls. An example's gradient of those weights is the sum of
its contributions from every call,

    g_i = Σ_k J_k(x_i)ᵀ δ_{i,k},

so its norm is ‖Σ_k …‖, not Σ_k ‖…‖ (cross terms). When the layer's handler sums rows
per example (``Handler.sums_rows_per_example``: Dense, EinsumDense, the convolutions) and
the calls' inputs share one shape, the calls become one call with K rows per example
(:func:`rows_of_calls`) on the handler's own path. Otherwise each call's per-example
contribution is a VJP of that call alone (generic.per_example_grads, with the
layer's activation bypassed when its handler recorded the pre-activation
output); they are summed per example, then per microbatch, before the norm.
Exact for any layer whose calls each see the batch's examples along axis 0 (the
engine checks the leading dimension of every call against the batch size).

>>> from tf_tempered._compat import keras
>>> import tf_tempered
>>> shared = keras.layers.Dense(2)
>>> a, b = keras.Input((3,)), keras.Input((3,))
>>> model = tf_tempered.make_private(keras.Model([a, b], shared(a) + shared(b)),
...                                  l2_norm_clip=1.0, noise_multiplier=0.0)
"""

import dataclasses
import types

from tf_tempered._compat import tf
from tf_tempered.privacy.errors import UnsupportedLayerError
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import generic

__all__ = ["SUMMARY", "group_calls", "multi_call_norms", "rows_of_calls"]

SUMMARY = ("calls of one input shape to a row handler (Dense, EinsumDense, convolutions) as one "
           "call of K rows per example on that handler's path; otherwise each call's per-example "
           "contribution by a VJP of that call, summed per example before the norm (a siamese "
           "tower, Keras 3's TimeDistributed); calls must see the batch's examples on axis 0")


def group_calls(records):
    """[(first record, [records of that layer])] in first-call order."""
    groups = {}
    for record in records:
        groups.setdefault(id(record.layer), (record, []))[1].append(record)
    return list(groups.values())


def multi_call_norms(calls, layout):
    """Norms of a layer's variables from the per-example sum of its calls' contributions."""
    layer = calls[0].layer
    handler = calls[0].handler
    for call in calls:
        _check_example_major(call, layout)
    merged = None
    if all(c.handler is handler for c in calls):
        merged = handler.merge_calls(calls)  # the handler adds up the calls itself (rnn_rows.py)
        if merged is None and handler.sums_rows_per_example:
            merged = rows_of_calls(calls)
    if merged is not None:
        layer_norms = handler.layer_result(merged, calls[0].hparams, layout)
        return dataclasses.replace(layer_norms, variables=handler.variables(layer, merged.hparams))
    variables = keras_bridge.own_trainable_weights(layer)
    per_example = None
    for call in calls:
        grads = generic.per_example_grads(call, variables,
                                          bypass_activation=call.handler.records_pre_activation,
                                          options=layout.options)
        per_example = grads if per_example is None else [
            p + g for p, g in zip(per_example, grads)]
    return generic.norms_from_per_example(variables, per_example, layout,
                                          f"multi_call[{len(calls)}]")


def rows_of_calls(calls):
    """K calls as one call of K rows per example, example-major: row b·K + k is example b's
    input (and output gradient) of call k. None unless every call has one input tensor of
    one static shape (the calls of Keras 3's TimeDistributed; a siamese tower's).

    A handler whose math sums over rows (``sums_rows_per_example``) then gives each
    example's g_i = Σ_k J_k(x_i)ᵀ δ_{i,k} in one pass, not K per-example VJPs.
    """
    inputs = [c.inputs for c in calls]
    if not all(tf.is_tensor(x) for x in inputs):
        return None
    input_shapes = {tuple(x.shape[1:]) for x in inputs}
    output_shapes = {tuple(c.grad_output.shape[1:]) for c in calls}
    if len(input_shapes) != 1 or len(output_shapes) != 1 or None in (
            next(iter(input_shapes)) + next(iter(output_shapes))):
        return None  # calls of several shapes, or of a shape not known while tracing

    def example_major(tensors):
        stacked = tf.stack(tensors, 1)  # [B, K, ...]
        return tf.reshape(stacked, [-1] + stacked.shape[2:].as_list())

    return types.SimpleNamespace(
        layer=calls[0].layer, handler=calls[0].handler, hparams=calls[0].hparams,
        inputs=example_major(inputs), grad_output=example_major([c.grad_output for c in calls]))


def _check_example_major(call, layout):
    """Each call must see the batch's examples on axis 0 (else the sum pairs wrong rows)."""
    message = (f"Layer {call.layer.name!r} is called more than once per step, and one call's "
               "input does not have the batch's examples on its first axis, so the DP engine "
               "cannot add up each example's contributions of the calls. Call a shared layer "
               "on tensors of shape [batch, ...] (reshape after the call, not before).")
    inputs = tf.nest.flatten(call.inputs)[0]  # a recurrent layer's may be [x, *states]
    rows = inputs.shape[0]
    if rows is not None and isinstance(layout.batch_size, int):
        if rows != layout.batch_size:
            raise UnsupportedLayerError(message + f" (got {rows} rows for a batch of "
                                        f"{layout.batch_size}).")
        return
    tf.debugging.assert_equal(tf.shape(inputs)[0], layout.batch_size, message=message)
