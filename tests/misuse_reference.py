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
"""Shared helpers of the misuse tests (tests/test_misuse_*.py): a per-example reference.

The reference is DP-SGD written out in float64 for ordinary Keras code: one tape per
example of the example's loss ℓ_i (what the user compiled, evaluated on that example
alone, reduced over its non-batch axes by its mean, or by its sum for a "sum"
reduction), the global norm, clip factor min(1, C/‖g_i‖), the mean over the batch.
With noise 0 and SGD at learning rate 1 the engine's update must equal its negative.
"""

import numpy as np

from tf_tempered._compat import keras, tf

__all__ = ["per_example_reference", "engine_update", "median_clip", "assert_update"]


def _grads(model, loss_of_example, x, y, weights):
    """Per-example gradients (float64 arrays) of ``loss_of_example(y_i, model(x_i))``."""
    grads = []
    for i in range(len(tf.nest.flatten(x)[0])):
        xi = tf.nest.map_structure(lambda t: t[i:i + 1], x)
        yi = tf.nest.map_structure(lambda t: t[i:i + 1], y)
        with tf.GradientTape() as tape:
            loss = loss_of_example(yi, model(xi, training=True), model)
            if weights is not None:
                loss = loss * weights[i]
        g = tape.gradient(loss, model.trainable_variables,
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
        grads.append([tf.convert_to_tensor(t).numpy().astype(np.float64) for t in g])
    return grads


def per_example_reference(build, weights, x, y, loss_of_example, sample_weight=None):
    """(per-example norms, clip → the DP-SGD update at lr 1) in float64."""
    model = build("float64")
    model.set_weights([w.astype(np.float64) for w in weights])
    cast = lambda t: t.astype(np.float64) if t.dtype.kind == "f" else t  # noqa: E731
    grads = _grads(model, loss_of_example, tf.nest.map_structure(cast, x),
                   tf.nest.map_structure(cast, y), sample_weight)
    norms = np.array([np.sqrt(sum(np.sum(t ** 2) for t in g)) for g in grads])

    def update(clip):
        factors = np.minimum(1.0, clip / norms)
        return [-sum(f * g[k] for f, g in zip(factors, grads)) / len(grads)
                for k in range(len(grads[0]))]

    return norms, update


def median_clip(norms):
    """A clip norm that clips some examples and not others."""
    clip = float(np.median(norms))
    assert 0 < np.mean(norms > clip) < 1, norms
    return clip


def engine_update(model, x, y, *, clip, loss, sample_weight=None, **compile_kwargs):
    """The engine's update of one fit on the whole batch (noise 0, SGD at lr 1)."""
    from tf_tempered.privacy import make_private  # pylint: disable=import-outside-toplevel
    make_private(model, l2_norm_clip=clip, noise_multiplier=0.0, sampling="shuffle")
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss=loss, **compile_kwargs)
    before = [w.numpy() for w in model.trainable_variables]
    rows = len(tf.nest.flatten(x)[0])
    history = model.fit(x, y, sample_weight=sample_weight, batch_size=rows, shuffle=False,
                        verbose=0).history
    return [w.numpy() - b for w, b in zip(model.trainable_variables, before)], history


def assert_update(ours, reference, rtol=1e-5):
    scale = max(np.abs(r).max() for r in reference)
    assert scale > 0
    for r, o in zip(reference, ours):
        assert r.shape == o.shape
        np.testing.assert_allclose(o, r, rtol=0, atol=rtol * scale)
