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
"""Per-microbatch gradient norms and clipped gradient sums from ONE backward pass.

DP-SGD needs, for every microbatch m, the L2 norm of its gradient g_m over all
trainable variables, and then Σ_m c_m·g_m with c_m = min(1, C/‖g_m‖). Stock TF
Privacy gets g_m by back-propagating once per microbatch. Here the forward pass
records, for each layer with trainable weights, its input A and its output Z
(pre-activation for Dense/Conv2D); one backward pass gives G = ∂(Σ_m ℓ_m)/∂Z,
whose rows are the per-example output gradients because examples do not mix.
A layer's weight gradient is then a sum of per-row outer products,

    ∂ℓ_m/∂W = Σ_{r ∈ rows(m)} a_r g_rᵀ,

(Dense rows: examples of the microbatch × any sequence positions; Conv2D rows: the
same × output pixels, with a_r the input patch of pixel r). Its squared norm is
computed per layer by the cheaper of

* ghost norm: ‖Σ_r a_r g_rᵀ‖² = Σ_{r,s} (a_r·a_s)(g_r·g_s), cost ∝ R²(d_in + d_out);
* materialization: form the d_in×d_out matrix per microbatch, cost ∝ R·d_in·d_out;

and the clipped sum is Σ_r a_r (c_{m(r)} g_r)ᵀ: the usual weight-gradient
product with rescaled output gradients ("book-keeping"; no second backward pass).
Other trainable layers (learnable TemperedSigmoid, LayerNormalization, Embedding,
...) get per-example gradients of their own weights from a vectorized VJP of that
layer alone, which is cheap because it does not go through the rest of the net.
"""

import contextlib
import functools
import threading

import numpy as np

from tf_tempered._compat import keras, tf

__all__ = ["LayerRecord", "Recorder", "instrument", "UnsupportedLayerError",
           "layer_sq_norms", "layer_clipped_grads"]


class UnsupportedLayerError(ValueError):
    """A layer whose per-example gradients the DP engine cannot compute exactly."""

    # Raised while Keras traces the train step; autograph re-raises an error as
    # its own type only if its constructor is Exception's (else StagingError).
    __init__ = Exception.__init__


_STATE = threading.local()


def _active_recorder():
    return getattr(_STATE, "recorder", None)


class LayerRecord:
    """What one call of an instrumented layer left for the backward pass."""

    def __init__(self, layer, kind, inputs, output, call_args, call_kwargs, call_fn):
        self.layer = layer
        self.kind = kind  # "dense", "conv2d" or "generic"
        self.inputs = inputs
        self.output = output  # Z (pre-activation) for dense/conv2d, the output otherwise
        self.call_args = call_args
        self.call_kwargs = call_kwargs
        self.call_fn = call_fn  # the layer's own, uninstrumented call
        self.grad_output = None  # ∂(Σ ℓ_m)/∂output, filled after the backward pass
        self.cache = {}


class Recorder:
    """Collects LayerRecords while active (a context manager, per thread)."""

    def __init__(self):
        self.records = []

    @contextlib.contextmanager
    def active(self):
        previous = _active_recorder()
        _STATE.recorder = self
        try:
            yield self
        finally:
            _STATE.recorder = previous


def _layer_kind(layer):
    if isinstance(layer, keras.layers.Dense) and type(layer).call is keras.layers.Dense.call:
        return "dense"
    if (isinstance(layer, keras.layers.Conv2D)
            and type(layer).call is keras.layers.Conv2D.call
            and getattr(layer, "groups", 1) == 1
            and layer.data_format == "channels_last"
            and layer.padding in ("same", "valid")):
        return "conv2d"
    return "generic"


def _own_trainable_weights(layer):
    # Weights created by the layer itself, not by its sub-layers.
    return list(getattr(layer, "_trainable_weights", [])) if layer.trainable else []


def instrument(model):
    """Installs recording hooks on every layer of `model` that owns trainable weights.

    Idempotent. Returns the instrumented layers. The hook is a no-op unless a
    Recorder is active, so inference, evaluation and saving are unaffected.
    """
    layers = []
    for layer in model._flatten_layers(include_self=False, recursive=True):  # pylint: disable=protected-access
        if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable:
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} is a BatchNormalization layer: in training it "
                "normalizes with statistics of the whole batch, so one example's "
                "gradient depends on the others and per-example clipping no longer "
                "bounds its influence (DP-SGD's guarantee fails). Replace it with "
                "keras.layers.GroupNormalization or keras.layers.LayerNormalization, "
                "or freeze it (layer.trainable = False) so it uses its moving statistics.")
        if not _own_trainable_weights(layer):
            continue
        if not getattr(layer, "_tf_tempered_instrumented", False):
            _wrap_call(layer)
        layers.append(layer)
    return layers


def _wrap_call(layer):
    original_call = layer.call
    kind = _layer_kind(layer)

    @functools.wraps(original_call)
    @tf.autograph.experimental.do_not_convert
    def call(inputs, *args, **kwargs):
        recorder = _active_recorder()
        # Frozen since make_private (layer.trainable = False): nothing to clip.
        if recorder is None or not _own_trainable_weights(layer):
            return original_call(inputs, *args, **kwargs)
        if not isinstance(inputs, (tf.Tensor, tf.Variable)) or isinstance(
                inputs, tf.SparseTensor):
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} received {type(inputs).__name__} inputs; the DP "
                "engine computes per-example gradients for layers called on one dense "
                "tensor. Pass dense tensors (or wrap the layer's logic in one).")
        if kind in ("dense", "conv2d"):
            activation = layer.activation
            # Record the pre-activation output: bypass Keras attribute tracking so
            # the layer's weight order and sub-layer list stay untouched.
            object.__setattr__(layer, "activation", keras.activations.linear)
            try:
                z = original_call(inputs, *args, **kwargs)
            finally:
                object.__setattr__(layer, "activation", activation)
            recorder.records.append(
                LayerRecord(layer, kind, inputs, z, args, kwargs, original_call))
            return activation(z) if activation is not None else z
        outputs = original_call(inputs, *args, **kwargs)
        if not isinstance(outputs, tf.Tensor):
            raise UnsupportedLayerError(
                f"Layer {layer.name!r} returns {type(outputs).__name__}; the DP engine "
                "supports trainable layers with one tensor output.")
        recorder.records.append(
            LayerRecord(layer, "generic", inputs, outputs, args, kwargs, original_call))
        return outputs

    object.__setattr__(layer, "call", call)
    object.__setattr__(layer, "_tf_tempered_instrumented", True)


# ---------------------------------------------------------------------------
# Per-layer norms and clipped sums. Every function takes the microbatch count M
# and works on tensors grouped as [M, rows, features].


def _group_rows(t, num_microbatches):
    return tf.reshape(t, [num_microbatches, -1, t.shape[-1]])


def _conv_patches(record):
    layer = record.layer
    kh, kw = layer.kernel_size
    sh, sw = layer.strides
    dh, dw = layer.dilation_rate
    return tf.image.extract_patches(
        record.inputs, sizes=[1, kh, kw, 1], strides=[1, sh, sw, 1],
        rates=[1, dh, dw, 1], padding=layer.padding.upper())


# Below this many (input channel, output channel) pairs a Conv2D's per-example
# kernel gradients come from one depthwise-conv backprop (batch folded into
# channels), which on CPU is several times faster than extracting patches.
_DEPTHWISE_MAX_CHANNEL_PAIRS = 64


def _conv_per_example_kernel_grads(record):
    """Per-example ∂ℓ_b/∂kernel of a Conv2D as [B, kh·kw·cin, cout], no patches."""
    layer = record.layer
    x = tf.cast(record.inputs, record.grad_output.dtype)
    g = record.grad_output
    batch = tf.shape(x)[0]
    height, width, cin = x.shape[1], x.shape[2], x.shape[3]
    oh, ow, cout = g.shape[1], g.shape[2], g.shape[3]
    kh, kw = layer.kernel_size
    # Input channel (b, c) of a depthwise conv with multiplier cout yields output
    # channels (b, c, o); the backprop filter then holds per-example gradients.
    x_folded = tf.reshape(tf.transpose(x, [1, 2, 0, 3]), [1, height, width, batch * cin])
    g_folded = tf.broadcast_to(tf.transpose(g, [1, 2, 0, 3])[:, :, :, None, :],
                               [oh, ow, batch, cin, cout])
    g_folded = tf.reshape(g_folded, [1, oh, ow, batch * cin * cout])
    filters = tf.compat.v1.nn.depthwise_conv2d_native_backprop_filter(
        x_folded, tf.stack([kh, kw, batch * cin, cout]), g_folded,
        strides=[1, *layer.strides, 1], padding=layer.padding.upper(),
        dilations=[1, *layer.dilation_rate, 1])
    per_example = tf.reshape(filters, [kh, kw, batch, cin, cout])
    return tf.reshape(tf.transpose(per_example, [2, 0, 1, 3, 4]), [batch, kh * kw * cin, cout])


def _static_rows(t, examples_per_microbatch):
    per_example = int(np.prod(t.shape[1:-1])) if len(t.shape) > 2 else 1
    return per_example * (examples_per_microbatch or 1)


def _prepare_linear(record, num_microbatches, examples_per_microbatch):
    """Groups A and G of a Dense/Conv2D record and picks ghost or materialized norms."""
    layer = record.layer
    if record.kind == "conv2d" and (
            record.inputs.shape[-1] * layer.filters <= _DEPTHWISE_MAX_CHANNEL_PAIRS):
        per_example = _conv_per_example_kernel_grads(record)
        record.cache["per_microbatch"] = tf.reduce_sum(
            tf.reshape(per_example, [num_microbatches, -1] + per_example.shape[1:].as_list()), 1)
        record.cache["g"] = _group_rows(record.grad_output, num_microbatches)
        record.cache["ghost"] = False
        return
    a = _conv_patches(record) if record.kind == "conv2d" else record.inputs
    rows = _static_rows(a, examples_per_microbatch)
    a = _group_rows(tf.cast(a, record.grad_output.dtype), num_microbatches)
    g = _group_rows(record.grad_output, num_microbatches)
    d_in, d_out = a.shape[-1], g.shape[-1]
    record.cache.update(a=a, g=g)
    # Unknown microbatch size (dynamic batch with a fixed microbatch count): the
    # ghost cost grows with its square, so materialize.
    ghost = examples_per_microbatch is not None and rows * rows * (d_in + d_out) < rows * d_in * d_out
    record.cache["ghost"] = ghost


def layer_sq_norms(record, num_microbatches, examples_per_microbatch):
    """Squared L2 norm of each microbatch's gradient of this layer's own weights: [M]."""
    if record.kind == "generic":
        per_example = _generic_per_example_grads(record)
        grouped = [tf.reduce_sum(tf.reshape(p, [num_microbatches, -1] + p.shape[1:].as_list()), 1)
                   for p in per_example]
        record.cache["per_microbatch"] = grouped
        return tf.add_n([tf.reduce_sum(tf.reshape(tf.square(p), [num_microbatches, -1]), 1)
                         for p in grouped])
    _prepare_linear(record, num_microbatches, examples_per_microbatch)
    g = record.cache["g"]
    if "per_microbatch" in record.cache:
        sq = tf.reduce_sum(tf.square(record.cache["per_microbatch"]), [1, 2])
    elif record.cache["ghost"]:
        a = record.cache["a"]
        if a.shape[1] == 1:
            sq = tf.reduce_sum(tf.square(a), [1, 2]) * tf.reduce_sum(tf.square(g), [1, 2])
        else:
            sq = tf.reduce_sum(tf.einsum("mri,msi->mrs", a, a) * tf.einsum("mro,mso->mrs", g, g),
                               [1, 2])
    else:
        per_microbatch = tf.einsum("mri,mro->mio", record.cache["a"], g)
        record.cache["per_microbatch"] = per_microbatch
        sq = tf.reduce_sum(tf.square(per_microbatch), [1, 2])
    if record.layer.use_bias:
        bias_grad = tf.reduce_sum(g, 1)
        record.cache["bias"] = bias_grad
        sq += tf.reduce_sum(tf.square(bias_grad), 1)
    return sq


def layer_clipped_grads(record, scale, finite):
    """Σ_m scale_m · (gradient of microbatch m) for each of the layer's own weights.

    `scale` is [M] (zero for microbatches whose gradient is not finite) and
    `finite` is [M] in {0, 1}; multiply_no_nan keeps NaN/inf from a dropped
    microbatch out of the sum. Returns {variable ref: gradient}.
    """
    layer = record.layer
    if record.kind == "generic":
        grads = {}
        for var, p in zip(_own_trainable_weights(layer), record.cache["per_microbatch"]):
            s = tf.reshape(tf.cast(scale, p.dtype), [-1] + [1] * (p.shape.rank - 1))
            grads[var.ref()] = tf.reduce_sum(tf.math.multiply_no_nan(p, s), 0)
        return grads
    s = tf.cast(scale, record.cache["g"].dtype)[:, None, None]
    if record.cache["ghost"] and record.kind == "conv2d":
        # Σ_b c_b ∂ℓ_b/∂kernel is the ordinary kernel gradient of the batch with
        # the output gradients rescaled per example: TF's own conv backprop op.
        kernel_grad = _conv_kernel_grad(record, scale, finite)
    elif record.cache["ghost"]:
        a = tf.math.multiply_no_nan(record.cache["a"], tf.cast(finite, s.dtype)[:, None, None])
        g = tf.math.multiply_no_nan(record.cache["g"], s)
        kernel_grad = tf.einsum("mri,mro->io", a, g)
    else:
        kernel_grad = tf.reduce_sum(tf.math.multiply_no_nan(record.cache["per_microbatch"], s), 0)
    grads = {layer.kernel.ref(): tf.reshape(kernel_grad, layer.kernel.shape)}
    if layer.use_bias:
        grads[layer.bias.ref()] = tf.reduce_sum(
            tf.math.multiply_no_nan(record.cache["bias"], s[:, :, 0]), 0)
    return grads


def _per_example(per_microbatch, like):
    """Repeats a [M] vector to one entry per example of `like` ([B, ...]), shaped to broadcast."""
    repeats = tf.shape(like)[0] // tf.shape(per_microbatch)[0]
    values = tf.repeat(tf.cast(per_microbatch, like.dtype), repeats)
    return tf.reshape(values, [-1] + [1] * (like.shape.rank - 1))


def _conv_kernel_grad(record, scale, finite):
    layer = record.layer
    g = tf.math.multiply_no_nan(record.grad_output, _per_example(scale, record.grad_output))
    x = tf.cast(record.inputs, g.dtype)
    x = tf.math.multiply_no_nan(x, _per_example(finite, x))
    return tf.compat.v1.nn.conv2d_backprop_filter(
        x, tf.constant(layer.kernel.shape.as_list()), g, strides=[1, *layer.strides, 1],
        padding=layer.padding.upper(), dilations=[1, *layer.dilation_rate, 1])


def _generic_per_example_grads(record):
    """Per-example gradients of a layer's own weights, by a VJP of that layer alone."""
    variables = _own_trainable_weights(record.layer)

    def one_example(args):
        x, gy = args
        with tf.GradientTape() as tape:
            tape.watch(variables)
            y = record.call_fn(x[None], *record.call_args, **record.call_kwargs)
        grads = tape.gradient(y, variables, output_gradients=gy[None],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return [tf.convert_to_tensor(g) for g in grads]

    return tf.vectorized_map(one_example, (record.inputs, record.grad_output))
