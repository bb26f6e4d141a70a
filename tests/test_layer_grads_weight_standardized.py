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
"""The WeightStandardizedConv2D handler: exact norms and clipped sums, XLA, layer_paths.

Its engine runs against float64 per-microbatch references are the "weight_standardized"
case of tests/test_conformance_conv.py; here the handler alone, against one
float64 tape per example (grouped layers too), compiled by XLA.
"""

import types

import numpy as np
import pytest

from tf_tempered._compat import keras, tf
from tf_tempered.layers import WeightStandardizedConv2D
from tf_tempered.privacy import (DPKerasSGDOptimizer, EngineOptions, layer_grads,
                                 layer_paths, make_private)
from tf_tempered.privacy.layer_grads import clip_weights as clip


@pytest.mark.parametrize("groups, norm_path, scaled", [(1, "ghost", True),
                                                       (2, "depthwise", False)])
def test_weight_standardized_handler_matches_per_example_tapes_under_xla(groups, norm_path,
                                                                         scaled):
    """The closed-form norms (ε large: its term matters) and the Jacobian-mapped clipped
    sum against one float64 tape per example, the handler's ops compiled by XLA: ghost
    norms with the book-keeping sum; groups = 2 (the patch sums per group of input
    channels) with kept per-example gradients (the depthwise backprop); the ghost case
    fan-in scaled (c·Ŵ: the gain enters K and b differently)."""
    layer = WeightStandardizedConv2D(4, 3, strides=2, padding="same", groups=groups,
                                     epsilon=0.05, scaled=scaled, dtype="float64")
    x = np.random.default_rng(0).normal(size=(6, 6, 5, 4))
    z = layer(x)
    g = np.random.default_rng(1).normal(size=z.shape)
    per_example = []
    for i in range(len(x)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x[i:i + 1]) * g[i:i + 1])
        per_example.append([t.numpy() for t in tape.gradient(loss, [layer.kernel, layer.bias])])
    sq_ref = np.array([sum(np.sum(t ** 2) for t in grads) for grads in per_example])
    scale = np.linspace(0.2, 1.0, len(x))
    handler, params = layer_grads.lookup(layer)
    assert handler.name == "weight_standardized_conv2d"
    step = layer_grads.MicrobatchLayout(len(x), 1, EngineOptions(native=False, norm_path=norm_path))

    @tf.function(jit_compile=True)
    def norms_and_sum(x, g, z, scale):
        record = types.SimpleNamespace(layer=layer, inputs=x, grad_output=g, output=z)
        norms = handler.layer_result(record, params, step)
        return norms.sq_norms, norms.clipped_sum(clip.ClipWeights(scale, tf.ones_like(scale)))

    sq, summed = norms_and_sum(tf.constant(x), tf.constant(g), z, tf.constant(scale))
    np.testing.assert_allclose(sq.numpy(), sq_ref, rtol=1e-9)
    for got, k in zip(summed, range(2)):
        want = sum(c * grads[k] for c, grads in zip(scale, per_example))
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=1e-10 * np.abs(want).max())


def test_layer_paths_report_the_weight_standardized_handler():
    ws = WeightStandardizedConv2D(3, 3, activation="tanh")
    model = make_private(keras.Sequential([keras.Input((6, 5, 2)), ws, keras.layers.Flatten(),
                                           keras.layers.Dense(2)]))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    model.fit(np.ones((4, 6, 5, 2)), np.zeros(4), batch_size=4, verbose=0)
    assert [(p["class"], p["handler"]) for p in layer_paths(model)] == [
        ("WeightStandardizedConv2D", "weight_standardized_conv2d"), ("Dense", "dense")]
