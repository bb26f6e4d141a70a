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
"""The tests' one oracle: the DP engine against a float64 GradientTape reference.

The reference is DP-SGD written out: one float64 tape per microbatch (of its mean
loss; a microbatch of one example for :func:`per_example_reference`, with the loss the
user compiled evaluated on that example alone), the global norm, TF Privacy's clip
factor min(1, C/‖g_m‖), the sum over microbatches divided by their number. The clip
norm is the median of the reference norms, so some microbatches are clipped and some
are not. With noise 0 and SGD at learning rate 1 the engine's update must equal the
reference's. Used by tests/conformance_harness.py (the layer families), the misuse
tests (tests/test_misuse_*.py: ordinary Keras code) and tests/test_gradients.py,
among others (tests/ is on sys.path: it is not a package).
"""

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.augment import declare_copies
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private

__all__ = ["BATCH", "LOSS", "assert_engine_matches_reference", "seeded", "_seeded",
           "per_example_reference", "engine_update", "median_clip", "assert_update",
           "assert_exact_update", "sparse_crossentropy_mean"]

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
BATCH = 16


def _microbatch_grads(model, x, y, num_microbatches, loss_of_batch=None, weights=None):
    """Each microbatch's gradient (of its mean loss) as float64 arrays, by tape.

    ``loss_of_batch(y_m, predictions, model)``: the microbatch's loss (default: the mean of
    LOSS); ``weights``: a factor per microbatch (sample weights of one-example microbatches).
    """
    rows = len(tf.nest.flatten(x)[0])
    size = rows // num_microbatches

    def gradient(xs, ys, weight):
        with tf.GradientTape() as tape:
            predictions = model(xs, training=True)
            loss = (tf.reduce_mean(LOSS(ys, predictions)) if loss_of_batch is None
                    else loss_of_batch(ys, predictions, model))
            if weight is not None:
                loss = loss * weight
        g = tape.gradient(loss, model.trainable_variables)
        # tf.convert_to_tensor: an Embedding's gradient is IndexedSlices (duplicates summed).
        # Zeros for a weight the loss does not reach, by hand: the tape's
        # UnconnectedGradients.ZERO reads a Keras 3 variable's dtype, a string.
        return [tf.zeros(v.shape, tf.as_dtype(v.dtype)) if t is None else tf.convert_to_tensor(t)
                for t, v in zip(g, model.trainable_variables)]

    # One trace for all microbatches: Keras XLA-compiles a grouped convolution anew at
    # every eager call (12 s of a grouped Conv1D case's 15 s; 1.4 s traced).
    traced = tf.function(gradient) if loss_of_batch is None and weights is None else None
    grads = []
    for m in range(num_microbatches):
        xs = tf.nest.map_structure(lambda t: t[m * size:(m + 1) * size], x)  # noqa: B023
        ys = tf.nest.map_structure(lambda t: t[m * size:(m + 1) * size], y)  # noqa: B023
        weight = None if weights is None else weights[m]
        g = None
        if traced is not None:
            try:
                g = traced(xs, ys, weight)
            except TypeError:  # Keras 3's RNN of stacked cells in float64 does not trace
                traced = None
        if g is None:
            g = gradient(xs, ys, weight)
        grads.append([t.numpy().astype(np.float64) for t in g])
    return grads


def _clipped_mean(grads):
    """(norms, clip → the DP-SGD update at lr 1) of per-microbatch gradients."""
    norms = np.array([np.sqrt(sum(np.sum(t ** 2) for t in g)) for g in grads])

    def update(clip):
        factors = np.minimum(1.0, clip / norms)
        return [-sum(f * g[i] for f, g in zip(factors, grads)) / len(grads)
                for i in range(len(grads[0]))]

    return norms, update


def _reference(builder, weights, x, y, num_microbatches):
    """(microbatch norms, function clip → DP-SGD update with lr 1) in float64."""
    model = builder("float64")
    model.set_weights([w.astype(np.float64) for w in weights])
    return _clipped_mean(_microbatch_grads(model, x.astype(np.float64), y, num_microbatches))


def per_example_reference(build, weights, x, y, loss_of_example, sample_weight=None):
    """(per-example norms, clip → the DP-SGD update at lr 1) in float64, for any loss:
    ``loss_of_example(y_i, model(x_i), model)`` (what the user compiled, on example i
    alone), times ``sample_weight[i]``."""
    model = build("float64")
    model.set_weights([w.astype(np.float64) for w in weights])
    cast = lambda t: t.astype(np.float64) if t.dtype.kind == "f" else t  # noqa: E731
    x, y = tf.nest.map_structure(cast, x), tf.nest.map_structure(cast, y)
    rows = len(tf.nest.flatten(x)[0])
    return _clipped_mean(_microbatch_grads(model, x, y, rows, loss_of_example, sample_weight))


def median_clip(norms):
    """A clip norm that clips some examples and not others."""
    clip = float(np.median(norms))
    assert 0 < np.mean(norms > clip) < 1, norms
    return clip


def sparse_crossentropy_mean(y_true, y_pred, model):
    """The per-example reference's loss for SparseCategoricalCrossentropy(from_logits=True)."""
    del model
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
        y_true, y_pred, from_logits=True))


def assert_exact_update(build, x, y, loss=None):
    """One fit's update (noise 0, clip at the median norm) equals the float64 reference of
    the sparse crossentropy from logits; ``loss``: what the model is compiled with (by
    default that loss), equal to it on every example."""
    weights = build().get_weights()
    norms, reference = per_example_reference(build, weights, x, y, sparse_crossentropy_mean)
    clip = median_clip(norms)
    model = build()
    model.set_weights(weights)
    ours, _ = engine_update(model, x, y, clip=clip, loss=loss or
                            keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    assert_update(ours, reference(clip))


def engine_update(model, x, y, *, clip, loss, sample_weight=None, options=None,
                  **compile_kwargs):
    """The engine's update of one fit on the whole batch (noise 0, SGD at lr 1)."""
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle",
                 options=options)
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss, **compile_kwargs)
    variables = list(model.trainable_variables)
    before = [w.numpy() for w in variables]
    rows = len(tf.nest.flatten(x)[0])
    history = model.fit(x, y, sample_weight=sample_weight, batch_size=rows, shuffle=False,
                        verbose=0).history
    # Weights Keras 3 builds in the fit's first step (Dense(activation=PReLU())) would pair
    # the update with the wrong variables: the caller builds the model first.
    assert [id(v) for v in model.trainable_variables] == [id(v) for v in variables], (
        "weights were built during the fit: call the model on the data before")
    return [w.numpy() - b for w, b in zip(variables, before)], history


def assert_update(ours, reference, rtol=1e-5):
    """``ours`` equals ``reference`` within rtol of the reference's largest entry."""
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=0, atol=rtol * scale)


def _engine_update(builder, weights, x, y, clip, num_microbatches, static_batch, dtype,
                   options=None, augmentation_multiplicity=1, jit_compile=False,
                   run_eagerly=False):
    model = builder(dtype)
    model.set_weights([w.astype(dtype) for w in weights])
    make_private(model, options=options, augmentation_multiplicity=augmentation_multiplicity)
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=clip, noise_multiplier=0.0,
                                                num_microbatches=num_microbatches,
                                                learning_rate=1.0), loss=LOSS,
                  jit_compile=jit_compile, run_eagerly=run_eagerly)
    before = [v.numpy() for v in model.trainable_variables]
    # Without drop_remainder the traced step does not know the batch size. (fit on
    # arrays whose size is a multiple of batch_size traces a static batch size.)
    data = tf.data.Dataset.from_tensor_slices((x.astype(dtype), y)).batch(
        len(x), drop_remainder=static_batch)
    if augmentation_multiplicity > 1:  # the rows are K consecutive copies of each example
        data = declare_copies(data, multiplicity=augmentation_multiplicity)
    history = model.fit(data, verbose=0).history
    assert model.train_function is not None
    after = [v.numpy() for v in model.trainable_variables]
    return [a - b for a, b in zip(after, before)], history


_REFERENCES = {}  # cache_key -> (weights, norms, clip, clipped fraction, reference update)


def _clipped_reference(builder, x, y, microbatches):
    weights = builder("float32").get_weights()
    norms, reference_update = _reference(builder, weights, x, y, microbatches)
    if microbatches > 1:
        clip = float(np.median(norms))
        clipped = np.mean(norms > clip)
        assert 0 < clipped < 1, norms  # a mix of clipped and unclipped microbatches
    else:  # one microbatch: clipped (half its norm)
        clip, clipped = float(norms[0]) / 2, 1.0
    return weights, norms, clip, clipped, reference_update(clip)


def assert_engine_matches_reference(builder, x, y, *, num_microbatches=None, static_batch=False,
                                    dtype="float32", options=None, cache_key=None,
                                    augmentation_multiplicity=1, jit_compile=False,
                                    run_eagerly=False):
    """The engine's update (noise 0) equals the float64 reference, clip at the median norm.

    jit_compile=True: the step compiled with XLA (the TF-ops paths a GPU runs);
    run_eagerly=True: the eager step.

    augmentation_multiplicity=K: the rows of x are K consecutive copies of each
    example; the reference's microbatches are then groups of K rows (one example).

    cache_key: tests that run one model on the same data under several engine
    options (paths, static or dynamic batch) may share its reference (numpy
    arrays only): pass a key that identifies (builder, x, y, num_microbatches).
    """
    microbatches = num_microbatches or len(x) // augmentation_multiplicity
    if cache_key is not None and cache_key in _REFERENCES:
        weights, norms, clip, clipped, reference = _REFERENCES[cache_key]
    else:
        weights, norms, clip, clipped, reference = _clipped_reference(builder, x, y,
                                                                      microbatches)
        if cache_key is not None:
            _REFERENCES[cache_key] = (weights, norms, clip, clipped, reference)
    ours, history = _engine_update(builder, weights, x, y, clip, num_microbatches,
                                   static_batch, dtype, options, augmentation_multiplicity,
                                   jit_compile, run_eagerly)
    np.testing.assert_allclose(history["dp_clipped_fraction"][0], clipped)
    np.testing.assert_allclose(history["dp_grad_norm"][0], norms.mean(), rtol=1e-4)
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    atol = (1e-5 if dtype == "float32" else 1e-6) * scale  # float64: the clip factors are float32
    for r, o in zip(reference, ours):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=0, atol=atol)
    return norms


_ONEDNN_CONV_GRADIENTS = []


def onednn_conv_gradients():
    """Whether this process differentiates Keras' dilated transposed convolutions.

    TensorFlow's CPU kernel of their gradient (Conv2DBackpropInput with dilations) needs
    oneDNN, which TensorFlow turns on by default only on CPUs with AVX-512 VNNI/BF16 or
    AMX (TF_ENABLE_ONEDNN_OPTS=1 turns it on elsewhere); Keras 3's Conv2DTranspose calls
    it, tf-keras' does not. (Grouped convolutions, which TF's CPU kernels differentiate
    only with oneDNN too, run anywhere: both Kerases XLA-compile them.)
    """
    if not _ONEDNN_CONV_GRADIENTS:
        layer = keras.layers.Conv2DTranspose(1, 2, padding="same", dilation_rate=2)
        try:
            with tf.GradientTape() as tape:
                y = tf.reduce_sum(layer(tf.ones([1, 3, 3, 2])))
            tape.gradient(y, layer.trainable_variables)
            _ONEDNN_CONV_GRADIENTS.append(True)
        except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError):
            _ONEDNN_CONV_GRADIENTS.append(False)
    return _ONEDNN_CONV_GRADIENTS[0]


def skip_without_onednn_conv_gradients():
    import pytest  # pylint: disable=g-import-not-at-top
    if not onednn_conv_gradients():
        pytest.skip("TensorFlow cannot differentiate Keras' dilated transposed "
                    "convolutions on this CPU (oneDNN is off; TF_ENABLE_ONEDNN_OPTS=1 turns "
                    "it on)")


def _seeded(builder, seed=0):
    def build(dtype):
        keras.utils.set_random_seed(seed)
        return builder(dtype)

    build.__name__ = builder.__name__
    return build


seeded = _seeded
