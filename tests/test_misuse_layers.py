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
"""Misuse tests, layers as Keras users write them: layers called on several tensors
(attention with a learned scale, FiLM), activity regularizers, microbatches with a
short last batch. Exact against a float64 per-example reference (dp_reference.py),
or refused before any update with the fix.
"""

import numpy as np
import pytest

from dp_reference import assert_update, engine_update, median_clip, per_example_reference
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPGradients, UnsupportedLayerError, layer_paths, make_private

pytestmark = pytest.mark.filterwarnings("ignore:noise_multiplier=0")

ROWS = 12
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _sce(y, p, model):
    del model
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, p, from_logits=True))


@keras.utils.register_keras_serializable(package="tf_tempered_tests")
class FiLM(keras.layers.Layer):
    """Feature-wise linear modulation: x·(1 + W c) + b, called on [x, c]."""

    def build(self, input_shape):
        features, condition = input_shape
        self.w = self.add_weight(shape=(condition[-1], features[-1]), name="w")
        self.b = self.add_weight(shape=(features[-1],), initializer="zeros", name="b")

    def call(self, inputs):
        x, c = inputs
        return x * (1.0 + tf.matmul(c, tf.cast(self.w, c.dtype))) + tf.cast(self.b, x.dtype)


def _two_inputs(layer_fn):
    def build(dtype):
        a = keras.Input((4, 3), dtype=dtype)
        b = keras.Input((4, 3), dtype=dtype)
        mixed = layer_fn(dtype)([a, b])
        out = keras.layers.Dense(3, dtype=dtype)(keras.layers.Flatten(dtype=dtype)(mixed))
        return keras.Model([a, b], out)
    return build


def _film(dtype):
    a = keras.Input((3,), dtype=dtype)
    c = keras.Input((2,), dtype=dtype)
    out = FiLM(dtype=dtype)([keras.layers.Dense(3, activation="tanh", dtype=dtype)(a), c])
    return keras.Model([a, c], keras.layers.Dense(3, dtype=dtype)(out))


_MULTI_INPUT = {
    "attention-use-scale": (
        _two_inputs(lambda d: keras.layers.Attention(use_scale=True, dtype=d)), (4, 3), (4, 3)),
    "additive-attention-use-scale": (
        _two_inputs(lambda d: keras.layers.AdditiveAttention(use_scale=True, dtype=d)),
        (4, 3), (4, 3)),
    "film": (_film, (3,), (2,)),
}


@pytest.mark.parametrize("case", sorted(_MULTI_INPUT))
def test_layers_called_on_several_tensors_train_exactly(case):
    build, shape_a, shape_b = _MULTI_INPUT[case]
    rng = np.random.default_rng(2)
    x = (rng.normal(size=(ROWS,) + shape_a).astype(np.float32),
         rng.normal(size=(ROWS,) + shape_b).astype(np.float32))
    y = rng.integers(0, 3, ROWS)
    model = build("float32")
    # A learned scale starts where it does not matter; move it so that its gradient counts.
    weights = [w + 0.3 * rng.normal(size=w.shape).astype(np.float32)
               for w in model.get_weights()]
    norms, reference = per_example_reference(build, weights, x, y, _sce)
    clip = median_clip(norms)
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip, loss=LOSS)
    assert_update(ours, reference(clip))
    assert "generic" in {p["handler"] for p in layer_paths(model)}


def _masked_attention(dtype):
    tokens = keras.Input((6,), dtype="int32")
    embedded = keras.layers.Embedding(9, 4, mask_zero=True, dtype=dtype)(tokens)
    attended = keras.layers.Attention(use_scale=True, dtype=dtype)([embedded, embedded])
    pooled = keras.layers.GlobalAveragePooling1D(dtype=dtype)(attended)
    return keras.Model(tokens, keras.layers.Dense(3, dtype=dtype)(pooled))


def test_a_layer_gets_each_example_of_its_mask():
    # Embedding(mask_zero=True) hands the attention layer a [batch, time] mask: each
    # example's VJP must see its own row of it.
    rng = np.random.default_rng(5)
    tokens = rng.integers(0, 9, (ROWS, 6)).astype(np.int32)
    tokens[:, 4:] = 0  # padding
    y = rng.integers(0, 3, ROWS)
    model = _masked_attention("float32")
    weights = [w + 0.3 * rng.normal(size=w.shape).astype(np.float32)
               for w in model.get_weights()]
    norms, reference = per_example_reference(_masked_attention, weights, tokens, y, _sce)
    clip = median_clip(norms)
    model.set_weights(weights)
    ours, _ = engine_update(model, tokens, y, clip=clip, loss=LOSS)
    assert_update(ours, reference(clip))


def _regularized(dtype):
    return keras.Sequential([
        keras.Input((5,), dtype=dtype),
        keras.layers.Dense(6, activation="tanh", dtype=dtype,
                           activity_regularizer=keras.regularizers.L1L2(l1=0.05, l2=0.2)),
        keras.layers.Dense(3, dtype=dtype)])


def test_an_activity_regularizer_joins_each_example_loss():
    # Keras adds regularizer(outputs) / batch size; example i's share is
    # regularizer(output_i): ℓ_i = CE_i + 0.05·|h_i|₁ + 0.2·|h_i|₂².
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(ROWS, 5)).astype(np.float32), rng.integers(0, 3, ROWS)

    def reference_loss(y_true, y_pred, model):
        hidden = model.layers[0](x_example[0])
        return (_sce(y_true, y_pred, model) + 0.05 * tf.reduce_sum(tf.abs(hidden))
                + 0.2 * tf.reduce_sum(tf.square(hidden)))

    weights = _regularized("float32").get_weights()
    x_example = [None]

    def loss_with_input(y_true, y_pred, model):
        return reference_loss(y_true, y_pred, model)

    # The reference needs the example's input: wrap the builder's model call.
    def build(dtype):
        model = _regularized(dtype)
        original = model.call

        def call(inputs, *args, **kwargs):
            x_example[0] = inputs
            return original(inputs, *args, **kwargs)

        object.__setattr__(model, "call", call)
        return model

    norms, reference = per_example_reference(build, weights, x, y, loss_with_input)
    clip = median_clip(norms)
    model = _regularized("float32")
    model.set_weights(weights)
    ours, history = engine_update(model, x, y, clip=clip, loss=LOSS)
    assert_update(ours, reference(clip))
    # A custom loop's DPGradients too, eager and traced (tf-keras refused it: the penalty
    # its construction left in model.losses was taken for an add_loss; probe Y).
    for traced in (False, True):
        loop_model = _regularized("float32")
        loop_model.set_weights(weights)
        dp = DPGradients(loop_model, LOSS, l2_norm_clip=clip, noise_multiplier=0.0)
        grads, _ = (tf.function(dp) if traced else dp)(x, y)
        assert_update([-g.numpy() for g in grads], reference(clip))
    hidden = np.tanh(x @ weights[0] + weights[1])
    penalty = 0.05 * np.abs(hidden).sum(1) + 0.2 * np.square(hidden).sum(1)
    expected = LOSS(y, model_before(weights, x)).numpy() + penalty.mean()
    np.testing.assert_allclose(history["loss"][0], expected, rtol=1e-5)


def model_before(weights, x):
    model = _regularized("float32")
    model.set_weights(weights)
    return model(x)


def test_weight_regularizers_and_add_loss_are_refused_naming_them():
    model = make_private(keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(3, kernel_regularizer="l2", name="head")]),
        l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=LOSS)
    with pytest.raises(ValueError, match="head.kernel_regularizer.*AdamW"):
        model.fit(np.ones((4, 5)), np.zeros(4), batch_size=4, verbose=0)


class PenalizedOutput(keras.Model):
    """Its only loss added in its call (compiled with loss=None)."""

    def __init__(self):
        super().__init__()
        self.head = keras.layers.Dense(1)

    def call(self, x):
        y = self.head(x)
        self.add_loss(tf.reduce_mean(tf.square(y)))
        return y


# Before: "The model was compiled without a loss", though its loss comes from add_loss.
def test_a_model_whose_only_loss_is_added_in_its_call_is_refused_naming_add_loss():
    x = np.random.default_rng(10).normal(size=(8, 3)).astype(np.float32)
    model = PenalizedOutput()
    model(x[:2])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer="sgd", loss=None)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(ValueError, match=r"add_loss in a layer's call.*loss=None: compile a loss "
                       r"of \(y_true, y_pred\) returning one value per example"):
        model.fit(x, np.zeros(8), batch_size=4, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))


def test_microbatches_with_a_short_last_batch():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(30, 5)).astype(np.float32), rng.integers(0, 3, 30)
    model = make_private(keras.Sequential([keras.Input((5,)), keras.layers.Dense(3)]),
                         l2_norm_clip=1.0, noise_multiplier=1.0, num_microbatches=4,
                         sampling="shuffle")
    model.compile(optimizer="sgd", loss=LOSS)
    steps = []
    counter = keras.callbacks.LambdaCallback(on_train_batch_end=lambda b, logs: steps.append(b))
    # Arrays: the short last batch (30 = 3·8 + 6, 6 not a multiple of 4) is dropped.
    model.fit(x, y, batch_size=8, epochs=2, callbacks=[counter], verbose=0)
    assert len(steps) == 6
    # A pipeline: refused before any step, with the fix.
    before = model.get_weights()
    with pytest.raises(ValueError, match="last batch holds 6.*drop_remainder=True"):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), verbose=0)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    # Poisson batches vary in size: microbatches need sampling="shuffle".
    make_private(model, sampling="poisson")
    with pytest.raises(ValueError, match='num_microbatches=4.*sampling="shuffle"'):
        model.fit(x, y, batch_size=8, verbose=0)


def _conv_bn_base(dtype):
    inputs = keras.Input((6, 6, 2), dtype=dtype)
    hidden = keras.layers.Conv2D(4, 3, dtype=dtype)(inputs)
    hidden = keras.layers.BatchNormalization(dtype=dtype)(hidden)
    hidden = keras.layers.Activation("tanh", dtype=dtype)(hidden)
    return keras.Model(inputs, keras.layers.GlobalAveragePooling2D(dtype=dtype)(hidden))


class _FineTuned(keras.Model):
    """Keras' fine-tuning flow, subclassed: the base unfrozen, called with training=False."""

    def __init__(self, dtype):
        super().__init__(dtype=dtype, name="fine_tuned")
        self.base = _conv_bn_base(dtype)
        self.head = keras.layers.Dense(3, dtype=dtype)

    def call(self, inputs, training=None):
        return self.head(self.base(inputs, training=False))


def _fine_tuned(dtype):
    model = _FineTuned(dtype)
    model(np.zeros((1, 6, 6, 2), dtype))
    return model


def _bn_data(model, seed=7):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(ROWS, 6, 6, 2)).astype(np.float32)
    y = rng.integers(0, 3, ROWS)
    # Moving statistics and γ, β away from their initial values, so that they count.
    weights = [w + 0.3 * rng.normal(size=w.shape).astype(np.float32) for w in model.get_weights()]
    bn = model.base.layers[2]
    variance_index = [id(v) for v in model.weights].index(id(bn.moving_variance))
    weights[variance_index] = np.abs(weights[variance_index]) + 0.5
    return x, y, weights


def test_batch_normalization_in_inference_mode_trains_exactly():
    # Unfrozen, but called with training=False: each example normalized with the moving
    # statistics (no mixing); γ and β get per-example gradients; the statistics stay.
    model = _fine_tuned("float32")
    x, y, weights = _bn_data(model)
    norms, reference = per_example_reference(_fine_tuned, weights, x, y, _sce)
    clip = median_clip(norms)
    model.set_weights(weights)
    bn = model.base.layers[2]
    moving = bn.moving_mean.numpy().copy()
    ours, _ = engine_update(model, x, y, clip=clip, loss=LOSS)
    assert_update(ours, reference(clip))
    np.testing.assert_array_equal(bn.moving_mean.numpy(), moving)
    assert np.abs(ours[[id(v) for v in model.trainable_variables].index(id(bn.gamma))]).max() > 0


def _refused_without_update(model, x, y):
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(Exception, match="training mode.*GroupNormalization.*training=False"):
        engine_update(model, x, y, clip=1.0, loss=LOSS)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_batch_normalization_in_training_mode_is_refused_before_any_update():
    rng = np.random.default_rng(8)
    x, y = rng.normal(size=(ROWS, 6, 6, 2)).astype(np.float32), rng.integers(0, 3, ROWS)
    base = _conv_bn_base("float32")
    model = keras.Sequential([base, keras.layers.Dense(3)])
    _refused_without_update(model, x, y)
    # Without γ and β it has no trainable weight, and still mixes the examples.
    bare = keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Conv2D(4, 3),
                             keras.layers.BatchNormalization(center=False, scale=False),
                             keras.layers.Flatten(), keras.layers.Dense(3)])
    _refused_without_update(bare, x, y)
    # Synchronized across replicas: Keras 3's synchronized=True; tf-keras' own class,
    # which is not a keras.layers.BatchNormalization (it trained unrefused before).
    synced = (keras.layers.experimental.SyncBatchNormalization()
              if hasattr(getattr(keras.layers, "experimental", None), "SyncBatchNormalization")
              else keras.layers.BatchNormalization(synchronized=True))
    _refused_without_update(keras.Sequential([keras.Input((6, 6, 2)), keras.layers.Flatten(),
                                              synced, keras.layers.Dense(3)]), x, y)
    # The functional fine-tuning flow: base(inputs, training=False) in a Functional model.
    # tf-keras keeps the nested call in inference mode; Keras 3 passes the outer call's
    # training=True to the nested model, so its BatchNormalization normalizes with the
    # batch's statistics there: refused.
    inputs = keras.Input((6, 6, 2))
    functional = keras.Model(inputs, keras.layers.Dense(3)(_conv_bn_base("float32")(
        inputs, training=False)))
    if keras.__version__.startswith("3"):
        _refused_without_update(functional, x, y)
    else:
        engine_update(functional, x, y, clip=1.0, loss=LOSS)


def _tape_reference(model, x, y):
    """(per-example norms, clip → -(mean of the clipped per-example gradients)), by tape
    on each example, in float32 (the quantized kernels have no float64 twin)."""
    grads = []
    for i in range(len(y)):
        with tf.GradientTape() as tape:
            loss = LOSS(y[i:i + 1], model(x[i:i + 1], training=True))
        grads.append([g.numpy().astype(np.float64)
                      for g in tape.gradient(loss, model.trainable_variables)])
    norms = np.array([np.sqrt(sum(float((g ** 2).sum()) for g in row)) for row in grads])

    def update(clip):
        scales = np.minimum(1.0, clip / norms)
        return [-np.mean([s * g for s, g in zip(scales, parts)], axis=0)
                for parts in zip(*grads)]
    return norms, update


def _quantized(mode, kind):
    layer = (keras.layers.Dense(6) if kind == "dense"
             else keras.layers.EinsumDense("btd,de->bte", output_shape=(4, 6)))
    model = keras.Sequential([keras.Input((4, 5)), layer, keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    layer.quantize(mode)
    layer.enable_lora(2)
    # B starts at zero (LoRA's initialization): move it so that A's gradient counts.
    layer.lora_kernel_b.assign(np.random.default_rng(3).normal(
        size=layer.lora_kernel_b.shape).astype(np.float32))
    return model


@pytest.mark.skipif(not keras.__version__.startswith("3"), reason="Keras 3 quantization")
@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("kind", ["dense", "einsum_dense"])
def test_lora_on_a_quantized_base_trains_exactly(mode, kind):
    # Keras 3 calls a quantized layer's quantized_call, not its call: recorded too (it was
    # refused as "no call recorded"); the frozen int8/int4 kernel costs nothing.
    rng = np.random.default_rng(4)
    x = rng.normal(size=(ROWS, 4, 5)).astype(np.float32)
    y = rng.integers(0, 3, ROWS)
    model = _quantized(mode, kind)
    norms, reference = _tape_reference(model, x, y)
    clip = median_clip(norms)
    ours, _ = engine_update(model, x, y, clip=clip, loss=LOSS)
    assert_update(ours, reference(clip), rtol=1e-4)  # float32 on both sides
    lora = {id(model.layers[0].lora_kernel_a), id(model.layers[0].lora_kernel_b)}
    assert lora <= {id(v) for v in model.trainable_variables}


@pytest.mark.skipif(not keras.__version__.startswith("3"), reason="Keras 3 quantization")
def test_float8_training_is_refused_with_the_fix():
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(3)])
    model.layers[0].quantize("float8")
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(ROWS, 5)).astype(np.float32), rng.integers(0, 3, ROWS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(Exception, match="overwritten with its 'gradient'.*int8"):
        engine_update(model, x, y, clip=1.0, loss=LOSS)
    for b, a in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


class _EightRowsAtATime(keras.layers.Layer):
    """A call written for a batch of exactly 8 rows (tf.unstack with a fixed count)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), name="w")

    def call(self, x):
        return tf.stack([tf.matmul(row[None], self.w)[0] for row in tf.unstack(x, num=8)])


class _KerasScan(keras.layers.Layer):
    """A recurrence over time by keras.ops.scan (TF's vectorization fails on it)."""

    def build(self, input_shape):
        self.w = self.add_weight(shape=(input_shape[-1], 3), name="w")

    def call(self, x):
        def step(h, x_t):
            h = tf.tanh(tf.matmul(x_t, self.w) + h)
            return h, h
        steps = tf.transpose(x, [1, 0, 2])
        last, _ = keras.ops.scan(step, tf.zeros([tf.shape(x)[0], 3]), steps)
        return last


_FAILING_ON_ONE_EXAMPLE = {"a_fixed_count_of_rows": (_EightRowsAtATime, (4,))}
if hasattr(getattr(keras, "ops", None), "scan"):  # Keras 3
    _FAILING_ON_ONE_EXAMPLE["keras_ops_scan"] = (_KerasScan, (5, 4))


# Before: TF's errors from inside the per-example VJP ("Dimension must be 8 but is 1",
# "`dtype` <dtype: 'variant'> is not compatible with 0 of dtype int64"), naming no fix.
@pytest.mark.parametrize("case", sorted(_FAILING_ON_ONE_EXAMPLE))
def test_a_layer_whose_call_fails_on_one_example_is_refused_naming_the_fix(case):
    layer, shape = _FAILING_ON_ONE_EXAMPLE[case]
    model = keras.Sequential([keras.Input(shape), layer(), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    x = np.random.default_rng(8).normal(size=(16,) + shape).astype(np.float32)
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    before = [w.copy() for w in model.get_weights()]
    with pytest.raises(UnsupportedLayerError, match=r"has no handler of its own.*call run on "
                       r"each example alone.*Fix: write its call for any number of rows"):
        model.fit(x, np.zeros(16), batch_size=8, shuffle=False, verbose=0)
    assert all((a == b).all() for a, b in zip(before, model.get_weights()))
