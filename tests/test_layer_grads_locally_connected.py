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
"""tf-keras' LocallyConnected1D/2D handler (layer_grads/locally_connected.py).

Its exactness in the engine, every path, both data formats and under XLA, is
tests/conformance_cases.py's ``locally_connected`` case (Keras 2 only: Keras 3 has no
LocallyConnected layers); here its pieces and mixed precision.
"""

import functools

import numpy as np
import pytest

from dp_reference import assert_update, engine_update, median_clip, per_example_reference
from tf_tempered._compat import KERAS_MAJOR, keras, tf
from tf_tempered.privacy import EngineOptions, layer_grads, layer_paths
from tf_tempered.privacy.layer_grads import locally_connected as lc
from tf_tempered.privacy.layer_grads import locally_connected_flat as lc_flat

pytestmark = pytest.mark.skipif(KERAS_MAJOR == 3, reason="Keras 3 has no LocallyConnected layers")

_LAYERS = {
    "2d": lambda: keras.layers.LocallyConnected2D(3, (3, 2), strides=(2, 1)),
    "2d_implementation_2": lambda: keras.layers.LocallyConnected2D(3, (3, 2), strides=(2, 1),
                                                                   implementation=2),
    "1d_implementation_3": lambda: keras.layers.LocallyConnected1D(3, 3, strides=2,
                                                                   implementation=3),
    "2d_channels_first": lambda: keras.layers.LocallyConnected2D(
        2, 2, strides=(1, 2), data_format="channels_first"),
    "1d": lambda: keras.layers.LocallyConnected1D(3, 3, strides=2),
    "1d_channels_first": lambda: keras.layers.LocallyConnected1D(2, 2,
                                                                 data_format="channels_first"),
}
_INPUTS = {"2d": (7, 6, 2), "2d_implementation_2": (7, 6, 2), "1d_implementation_3": (9, 4),
           "2d_channels_first": (2, 5, 6), "1d": (9, 4),
           "1d_channels_first": (3, 7)}


@pytest.mark.parametrize("kind", [kind for kind in _LAYERS if "implementation" not in kind])
def test_windows_times_each_positions_kernel_is_the_layers_output(kind):
    """z_{e,r} = p_{e,r}·W_r + b_r: the windows are cut and ordered as the layer's kernel reads them."""
    layer = _LAYERS[kind]()
    x = tf.constant(np.random.default_rng(0).normal(size=(4,) + _INPUTS[kind]), tf.float32)
    z = layer(x)
    handler, hparams = layer_grads.lookup(layer)
    assert handler.name == "locally_connected"
    p = lc._windows(x, hparams)  # pylint: disable=protected-access
    ours = tf.einsum("brk,rkf->brf", p, layer.kernel)
    z_without_bias = z - tf.reshape(layer.bias, [1] + list(z.shape[1:]))
    expected = lc._output_rows(z_without_bias, hparams)  # pylint: disable=protected-access
    np.testing.assert_allclose(ours.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", list(_LAYERS))
def test_the_handlers_own_forward_is_the_layers_call(kind):
    """recorded_call: activation(z) equals the layer's output; the windows are recorded."""
    layer = _LAYERS[kind]()
    layer.activation = keras.activations.tanh
    x = tf.constant(np.random.default_rng(3).normal(size=(4,) + _INPUTS[kind]), tf.float32)
    expected = layer(x)
    handler, hparams = layer_grads.lookup(layer)
    outputs, recorded_inputs, z = handler.recorded_call(layer, hparams, layer.call, x, (), {},
                                                        lambda t: t)
    np.testing.assert_allclose(outputs.numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.tanh(z.numpy()), expected.numpy(), rtol=1e-5, atol=1e-6)
    windows = x if "implementation" in kind else lc._windows(x, hparams)  # pylint: disable=protected-access
    np.testing.assert_array_equal(recorded_inputs.numpy(), windows.numpy())


@pytest.mark.parametrize("examples", [1, 3])
def test_ghost_norms_equal_the_materialized_gradients_norms(examples):
    """Σ_r Σ_{e,e'} (p·p')(g·g') = ‖Σ_e p_{e,r} g_{e,r}ᵀ‖² summed over positions, per microbatch."""
    rng = np.random.default_rng(1)
    p, g = (tf.constant(rng.normal(size=(6, 5, d))) for d in (4, 3))
    per_microbatch = lc._materialized(p, g, 6 // examples)  # pylint: disable=protected-access
    expected = np.einsum("merk,merf->mrkf", p.numpy().reshape(-1, examples, 5, 4),
                         g.numpy().reshape(-1, examples, 5, 3))
    np.testing.assert_allclose(per_microbatch.numpy(), expected.reshape(6 // examples, -1))
    for rows in (examples, None):  # known while tracing, or decided per step
        np.testing.assert_allclose(lc.ghost_sq_norms(p, g, 6 // examples, rows).numpy(),
                                   np.sum(expected.reshape(6 // examples, -1) ** 2, 1))


@pytest.mark.parametrize("rows", [1, 2, None])
def test_masked_norms_equal_the_masked_gradients_norms(rows):
    """implementation=2: Σ_{e,e'} ((x_e ⊙ x_e')ᵀ Mask)·(g_e ⊙ g_e') = ‖(X_mᵀ G_m) ⊙ Mask‖²."""
    rng = np.random.default_rng(5)
    x, g = tf.constant(rng.normal(size=(6, 5))), tf.constant(rng.normal(size=(6, 4)))
    mask = tf.constant((rng.random((5, 4)) < 0.5).astype(np.float64))
    m = 6 // (rows or 2)
    grads = np.einsum("mei,meo->mio", x.numpy().reshape(m, -1, 5), g.numpy().reshape(m, -1, 4))
    expected = np.sum((grads * mask.numpy()) ** 2, (1, 2))
    np.testing.assert_allclose(lc_flat.masked_sq_norms(x, g, mask, m, rows).numpy(), expected)


def _model(dtype, implementation=1):
    return keras.Sequential([
        keras.Input((7, 6, 2), dtype=dtype),
        keras.layers.LocallyConnected2D(3, (3, 2), strides=(2, 1), activation="tanh",
                                        implementation=implementation, dtype=dtype),
        keras.layers.Reshape((15, 3), dtype=dtype),
        keras.layers.LocallyConnected1D(2, 3, strides=2, implementation=implementation,
                                        dtype=dtype),
        keras.layers.Flatten(dtype=dtype),
        keras.layers.Dense(3, dtype=dtype)])


def _sce(y, logits, model):
    del model
    return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                       from_logits=True))


@pytest.mark.parametrize("implementation,jit_compile", [(1, False), (1, True), (2, False),
                                                        (2, True), (3, False)])
def test_mixed_float16_gives_the_float32_update(implementation, jit_compile):
    """Half-precision inputs and output gradients: norms and sums in float32, the update
    the float64 reference's to half precision's forward pass (implementation=3's sparse
    matmul has no XLA kernel, with or without DP)."""
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(8, 7, 6, 2)).astype(np.float32), rng.integers(0, 3, 8)
    build = functools.partial(_model, implementation=implementation)
    weights = build("float32").get_weights()
    norms, reference = per_example_reference(build, weights, x, y, _sce)
    clip = median_clip(norms)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((7, 6, 2))] + [
            type(layer).from_config({**layer.get_config(), "dtype": "mixed_float16"})
            for layer in build("float32").layers[:-1]] + [keras.layers.Dense(3, dtype="float32")])
        model.set_weights(weights)
        ours, history = engine_update(model, x, y, clip=clip,
                                      loss=keras.losses.SparseCategoricalCrossentropy(
                                          from_logits=True), jit_compile=jit_compile)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert history["dp_nonfinite"] == [0.0]
    assert {p["handler"] for p in layer_paths(model)
            if p["class"].startswith("LocallyConnected")} == {"locally_connected"}
    assert_update(ours, reference(clip), rtol=5e-3)


def _shared_and_time_distributed(dtype, implementation=1):
    # One LocallyConnected2D called on two inputs (its calls' rows summed per example), and
    # tf-keras' TimeDistributed(LocallyConnected1D), which folds 3 frames into its batch.
    x = keras.Input((3, 6, 4), dtype=dtype)
    shared = keras.layers.LocallyConnected2D(2, 2, activation="tanh", dtype=dtype,
                                             implementation=implementation)
    frames = keras.layers.Reshape((3, 6, 4), dtype=dtype)(x)
    spread = keras.layers.TimeDistributed(
        keras.layers.LocallyConnected1D(2, 3, strides=3, dtype=dtype,
                                        implementation=implementation), dtype=dtype)(frames)
    both = keras.layers.Concatenate(dtype=dtype)([
        keras.layers.Flatten(dtype=dtype)(shared(x)),
        keras.layers.Flatten(dtype=dtype)(shared(-x)),
        keras.layers.Flatten(dtype=dtype)(spread)])
    return keras.Model(x, keras.layers.Dense(3, dtype=dtype)(both))


@pytest.mark.parametrize("implementation", [1, 2, 3])
@pytest.mark.parametrize("norm_path", ["ghost", "materialize"])
@pytest.mark.parametrize("num_microbatches,static_batch", [(None, False), (3, True)])
def test_shared_layer_and_time_distributed_rows_match_the_reference(num_microbatches,
                                                                    static_batch, norm_path,
                                                                    implementation):
    from dp_reference import assert_engine_matches_reference, seeded  # pylint: disable=g-import-not-at-top
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(6, 3, 6, 4)), rng.integers(0, 3, 6)
    def build(dtype):
        return _shared_and_time_distributed(dtype, implementation)

    assert_engine_matches_reference(seeded(build), x, y,
                                    num_microbatches=num_microbatches, static_batch=static_batch,
                                    options=EngineOptions(norm_path=norm_path))
