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
"""Conv2D geometries for the native per-microbatch kernel-gradient ops, and their reference:
the gradient of Σ conv(x_e)·g_e w.r.t. a real Conv2D's kernel, one tape per example e,
summed over each group of consecutive examples."""

import numpy as np

from tf_tempered._compat import keras, tf

# Max abs error allowed, relative to the reference's max abs value.
RTOL = {"float32": 1e-5, "float64": 1e-12}

# padding, kernel, strides, dilation, (H, W), cin, cout, batch, num_groups
CASES = [
    ("valid", 3, 1, 1, (7, 6), 1, 5, 6, 6),
    ("same", 3, 1, 1, (7, 6), 3, 7, 6, 2),
    ("valid", 3, 2, 1, (9, 8), 5, 16, 4, 1),
    ("same", 3, 3, 1, (10, 8), 3, 33, 12, 3),
    ("valid", 5, 3, 1, (12, 11), 1, 32, 4, 2),
    ("same", (3, 2), (2, 1), 1, (9, 7), 5, 7, 4, 4),
    ("valid", 2, (1, 3), 1, (6, 10), 3, 7, 6, 3),
    ("valid", (3, 2), 1, (1, 2), (8, 9), 3, 16, 6, 3),
    ("same", 3, 1, (2, 2), (9, 9), 1, 32, 4, 2),
    ("valid", 3, 1, (2, 2), (9, 8), 5, 5, 12, 12),
    ("same", (2, 3), 1, (1, 2), (7, 8), 3, 33, 4, 1),
    ("same", 5, 1, 1, (3, 4), 3, 5, 2, 1),  # kernel larger than the image
    ("valid", 1, 2, 1, (5, 5), 5, 7, 3, 3),
    ("same", 8, 2, 1, (28, 28), 1, 16, 4, 2),  # MNIST conv1
    ("same", 4, 2, 1, (7, 7), 16, 32, 6, 3),  # MNIST conv2
]


def case_id(case):
    padding, kernel, strides, dilation, hw, cin, cout, batch, groups = case
    return f"{padding}-k{kernel}-s{strides}-d{dilation}-{hw}-c{cin}x{cout}-b{batch}g{groups}"


def setup(case, dtype, seed=0):
    padding, kernel, strides, dilation, (h, w), cin, cout, batch, groups = case
    layer = keras.layers.Conv2D(cout, kernel, strides=strides, padding=padding,
                                dilation_rate=dilation, dtype=dtype)
    layer.build((None, h, w, cin))
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.normal(size=(batch, h, w, cin)), dtype)
    g = tf.constant(rng.normal(size=layer(x).shape), dtype)
    return layer, x, g, groups


def reference(layer, x, g, groups):
    """Per-example tape gradients w.r.t. layer.kernel, flattened, summed per group."""
    per_example = []
    for e in range(x.shape[0]):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x[e:e + 1]) * g[e:e + 1])
        per_example.append(tf.reshape(tape.gradient(loss, layer.kernel), [-1]).numpy())
    per_example = np.stack(per_example)
    return per_example.reshape(groups, -1, per_example.shape[-1]).sum(axis=1)
