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
"""Keras 3's compiled metrics and loss, built before ``fit`` traces the DP step.

Without a distribution strategy Keras 3's TensorFlow trainer builds them inside the first
trace of its train step (``_maybe_symbolic_build``: deferred "for backwards
compatibility"). The metric variables created there make tf.function trace the step a
second time, once allowing variable creation and once not: for the DP step, whose trace
is most of a short fit's time, 0.3-0.4 s more a ``fit`` on the MNIST CNN
(benchmarks/results/fit_single_trace.md). Built first from the shapes of the training
data, as Keras itself does under a strategy, the step is traced once.
"""

from tf_tempered._compat import KERAS_MAJOR, keras, tf

__all__ = ["build_compiled_state"]


def build_compiled_state(model, data_spec):
    """Builds ``model``'s unbuilt compiled metrics and loss; returns whether it built any.

    ``data_spec``: the TypeSpecs of one training batch, ``(x, y[, sample_weight])``. Nothing
    is built (Keras then builds them where it always does) on Keras 2, under a distribution
    strategy (Keras builds them itself, in its scope), without labels, for inputs that are
    not plain tensors, or when the model's outputs cannot be computed symbolically.
    """
    if KERAS_MAJOR != 3 or getattr(model, "_distribute_strategy", None) is not None:
        return False
    unbuilt = [c for c in (getattr(model, "_compile_metrics", None),
                           getattr(model, "_compile_loss", None))
               if c is not None and not c.built]
    if not unbuilt or not isinstance(data_spec, tuple) or not 2 <= len(data_spec) <= 3:
        return False
    x_spec, y_spec = data_spec[0], data_spec[1]
    specs = tf.nest.flatten(x_spec) + tf.nest.flatten(y_spec)
    if not specs or not all(type(s) is tf.TensorSpec for s in specs):  # noqa: E721
        return False  # ragged, sparse, None labels: left to Keras
    to_symbolic = lambda s: keras.KerasTensor(s.shape, s.dtype.name)  # noqa: E731
    x, y = tf.nest.map_structure(to_symbolic, (x_spec, y_spec))
    from keras.src import backend  # pylint: disable=g-import-not-at-top
    try:
        y_pred = backend.compute_output_spec(model, x, training=False)
    except Exception:  # pylint: disable=broad-except
        return False  # Keras builds them inside the trace, as before
    for container in unbuilt:
        container.build(y, y_pred)
    return True
