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
"""Keras internals about variables: a hashable key, the tf.Variable a Keras 3 variable
holds (what a tape watches, what an optimizer may update), shapes as ints, the weights a
model holds before tf-keras has built it.

>>> v = keras.Variable([[1.0, 2.0]]) if IS_KERAS3 else tf.Variable([[1.0, 2.0]])
>>> shape_of(v), variable_key(v) == id(v)
((1, 2), True)
"""

from tf_tempered._compat import KERAS_MAJOR, keras, tf  # noqa: F401  (keras: the doctest)

__all__ = ["existing_weights", "first_copy", "overwritten_with_gradient", "shape_of",
           "variable_aliases", "variable_key", "watchable"]

IS_KERAS3 = KERAS_MAJOR == 3


def variable_key(variable):
    """A hashable key of a variable (Keras 3 variables have no `.ref()`)."""
    return id(variable)


def existing_weights(model):
    """The variables ``model`` holds so far.

    tf-keras refuses ``model.weights`` of a Sequential without an Input until its first
    call ("Weights ... have not yet been created"); its layers' weights that exist (layers
    built elsewhere, shared) are then all it holds.
    """
    try:
        return list(model.weights)
    except ValueError:
        return [w for layer in getattr(model, "layers", []) for w in existing_weights(layer)]


def variable_aliases(variable):
    """``variable`` and, on Keras 3, the tf.Variable that holds its value: a Keras optimizer
    updates either (``tape.watched_variables()`` and ``variable.value`` give the latter), so
    a mark that decides whether an update may run goes on both."""
    backing = getattr(variable, "_value", None) if IS_KERAS3 else None
    if isinstance(backing, tf.Variable) and backing is not variable:
        return (variable, backing)
    return (variable,)


def overwritten_with_gradient(variable):
    """True for a Keras 3 variable the optimizer overwrites with its "gradient" (float8
    training's scales and amax histories: statistics of the batch, not gradients)."""
    return bool(getattr(variable, "overwrite_with_gradient", False))


def watchable(variable):
    """What `tf.GradientTape.watch` takes for a layer variable: the variable in Keras 2,
    the tf.Variable backing it in Keras 3 (the tape refuses a Keras 3 Variable;
    `tape.gradient` w.r.t. either reaches the same resource)."""
    return variable.value if IS_KERAS3 else variable


def shape_of(variable):
    """A variable's static shape as a tuple of ints (TensorShape in Keras 2, tuple in 3)."""
    return tuple(int(d) for d in variable.shape)


def first_copy(variable):
    """``variable``, or a tf.distribute variable's first copy: its copies agree (mirrored),
    and read whole under another strategy's scope it raises RuntimeError ("Mixing
    different tf.distribute.Strategy objects": a model made under one strategy, its steps
    read while another's fit begins)."""
    if isinstance(variable, tf.distribute.DistributedValues):
        return variable.values[0]
    return variable
