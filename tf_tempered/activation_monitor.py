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
"""ActivationNormMonitor: the mean per-example L2 norm of a layer's outputs, each epoch.

Papernot et al. 2021, Figure 4: tempered sigmoids keep activations bounded while ReLU
activations grow. A callback of the active Keras (3 by default, 2 with
``TF_USE_LEGACY_KERAS=1``).
"""

import numbers

import numpy as np

from tf_tempered._compat import keras, tf
from tf_tempered.privacy import data_sampling

__all__ = ["ActivationNormMonitor", "plot_activation_norms"]


class ActivationNormMonitor(keras.callbacks.Callback):
    """Mean per-example L2 norm of a layer's outputs on held-out data, every few epochs.

    ``norm = mean_i ||flatten(layer(x_i))||_2`` over ``data`` (a NumPy array of inputs,
    or a batched tf.data.Dataset of inputs or of (inputs, labels, ...) tuples, whose
    first item is used). Logged as ``activation_norm/<layer name>`` after each
    ``every``-th epoch and kept in ``.epochs`` / ``.history``.

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(
    ...     2, use_bias=False, kernel_initializer="identity", name="hidden")])
    >>> monitor = ActivationNormMonitor("hidden", np.array([[3.0, 4.0], [0.0, 1.0]]))
    >>> monitor.set_model(model)
    >>> monitor.compute()
    3.0
    """

    def __init__(self, layer, data, *, every=1, plot_path=None):
        super().__init__()
        if isinstance(every, bool) or not isinstance(every, numbers.Integral) or every < 1:
            raise ValueError(f"every must be a positive integer, got {every!r}; e.g. every=1.")
        if not isinstance(layer, (str, keras.layers.Layer)):
            raise ValueError(f"layer must be a Keras layer or a layer name, got {layer!r}.")
        self.layer = layer
        self.every = int(every)
        self.plot_path = plot_path
        if isinstance(data, tf.data.Dataset):
            if data_sampling.made_from_poisson_batches(data):
                raise ValueError(
                    "data is a pipeline of tf_tempered.privacy.poisson_batches: its padded "
                    "batches would count padding rows as examples, and it draws from the "
                    "training data, whose norms are released without noise. Fix: pass "
                    "held-out inputs (a NumPy array or a batched tf.data.Dataset).")
            spec = data.element_spec
            if isinstance(spec, (tuple, list)):
                data = data.map(lambda *items: items[0])
            self._dataset = data
        else:
            self._dataset = tf.data.Dataset.from_tensor_slices(np.asarray(data)).batch(256)
        self.epochs = []
        self.history = []
        self._probe = None
        self._probe_model = None

    @property
    def layer_name(self):
        return self.layer if isinstance(self.layer, str) else self.layer.name

    @property
    def key(self):
        """The log key, ``activation_norm/<layer name>``."""
        return f"activation_norm/{self.layer_name}"

    def _build_probe(self):
        layer = self.model.get_layer(self.layer) if isinstance(self.layer, str) else self.layer
        try:
            sub_model = keras.Model(self.model.inputs, layer.output)
        except (AttributeError, ValueError, TypeError) as e:
            raise ValueError(
                f"ActivationNormMonitor cannot read the outputs of layer {layer.name!r}: the "
                f"model must be a built Sequential or functional model containing it "
                f"({e}).") from e

        @tf.function(reduce_retracing=True)
        def norms(inputs):
            outputs = tf.cast(sub_model(inputs, training=False), tf.float64)
            return tf.norm(tf.reshape(outputs, [tf.shape(outputs)[0], -1]), axis=1)

        self._probe, self._probe_model = norms, self.model

    def compute(self):
        """The mean per-example L2 norm of the layer's outputs on the data, now."""
        if self._probe is None or self._probe_model is not self.model:
            self._build_probe()
        total, count = 0.0, 0
        for inputs in self._dataset:
            norms = self._probe(inputs).numpy()
            total += float(norms.sum())
            count += norms.shape[0]
        if count == 0:
            raise ValueError("ActivationNormMonitor: data is empty; pass held-out inputs.")
        return total / count

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every:
            return
        value = self.compute()
        self.epochs.append(epoch + 1)
        self.history.append(value)
        if logs is not None:
            logs[self.key] = value

    def on_train_end(self, logs=None):
        if self.plot_path is not None and self.history:
            self.plot(self.plot_path)

    def plot(self, path=None, *, label=None):
        """Saves the norm per epoch as a PNG (matplotlib, Agg); returns the path."""
        path = path if path is not None else self.plot_path
        if path is None:
            raise ValueError("plot needs a path: plot('norms.png') or plot_path= at init.")
        return plot_activation_norms({label or self.layer_name: self}, path)


def plot_activation_norms(monitors, path, *, title="Mean L2 norm of activations"):
    """Saves one PNG comparing several monitors, e.g. {"ReLU": m1, "tempered sigmoid": m2}.

    Uses matplotlib's Agg canvas directly, so the global backend is left alone.
    """
    from tf_tempered._plotting import agg_figure  # pylint: disable=g-import-not-at-top

    figure, (axes,) = agg_figure(figsize=(5, 3.5))
    for label, monitor in monitors.items():
        axes.plot(monitor.epochs, monitor.history, marker="o", label=label)
    axes.set_xlabel("epoch")
    axes.set_ylabel("mean per-example L2 norm")
    axes.set_title(title)
    axes.legend()
    figure.savefig(path, format="png")
    return path
