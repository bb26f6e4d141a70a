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
"""TensorFlow runtime facts the engine's path choices depend on, static values of a
traced graph, read from TF internals, and tf-keras' AutoGraph conversion of a layer's call."""

import contextlib
import functools
import os

from tf_tempered._compat import KERAS_MAJOR, tf

__all__ = ["autographed_call", "layer_calls_autographed", "onednn_enabled",
           "partial_static_vector", "flag_variable", "in_xla_context"]


@contextlib.contextmanager
def layer_calls_autographed():
    """While the engine's step (not converted by AutoGraph) calls the model: tf-keras
    converts each subclassed layer's call under the status it finds, as it does under
    Keras' converted train_step (a layer without weights, whose call no recording wrapper
    converts, with a Python ``if`` on a tensor). Keras 3 converts no layer's call."""
    if KERAS_MAJOR == 3 or not tf.inside_function():
        yield
        return
    from tensorflow.python.autograph.core import ag_ctx  # pylint: disable=import-outside-toplevel
    with ag_ctx.ControlStatusCtx(status=ag_ctx.Status.ENABLED):
        yield


def autographed_call(layer, call):
    """``call`` converted by AutoGraph as tf-keras converts a subclassed layer's call at each
    ``__call__`` (Python ``for``/``if`` over tensors in it), when tf-keras would: the engine's
    recording wrapper stands in for the call and is itself not converted (inside it
    AutoGraph's status reads "disabled", so a graph being traced is the test). Keras 3
    converts no layer's call: ``call`` as it is."""
    should_convert = getattr(layer, "_should_use_autograph", None)
    if should_convert is None or not tf.inside_function() or not should_convert():
        return call
    from tensorflow.python.autograph.core import ag_ctx  # pylint: disable=import-outside-toplevel
    return tf.__internal__.autograph.tf_convert(
        call, ag_ctx.ControlStatusCtx(status=ag_ctx.Status.ENABLED))


def flag_variable(name, owner):
    """A scalar float32 variable holding 0, made eagerly also while a tf.function is traced
    again (tf.Variable refuses to be made on a trace other than the first: a
    ResourceVariable of its own is not the function's). Tracked by ``owner`` (an
    optimizer) for TensorFlow only, so tf.saved_model.save of a function that captures it
    finds it (Keras' own saving lists its variables, which this is not one of)."""
    from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-import-not-at-top
    with tf.init_scope():
        flag = resource_variable_ops.ResourceVariable(0.0, trainable=False, name=name)
    flags = [k for k in vars(owner) if k.startswith("_" + name)]
    setattr(owner, f"_{name}_{len(flags)}", flag)
    return flag


def in_xla_context():
    """Whether the graph being traced is compiled by XLA (a ``tf.function(jit_compile=True)``
    or inside one): XLA drops ``tf.debugging.Assert``, logging "Ignoring Assert operator"
    at each compile (TF 2.21), so a check at run time there has to be part of the data flow,
    and an assertion is better left out."""
    from tensorflow.python.ops import control_flow_util  # pylint: disable=import-outside-toplevel
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def partial_static_vector(tensor):
    """The values of an int vector known while tracing, None for the others (a concat or a
    stack of constants and run-time values: a slice's begin ``[0, i, 0]``)."""
    from tensorflow.python.framework import tensor_util  # pylint: disable=import-outside-toplevel
    return tensor_util.constant_value_as_shape(tensor).as_list()


@functools.lru_cache(maxsize=None)
def onednn_enabled():
    """Whether TensorFlow runs its CPU kernels from oneDNN in this process.

    TF 2.21 turns oneDNN on by default only on x86 CPUs with AVX-512 (and on request,
    ``TF_ENABLE_ONEDNN_OPTS=1``); the depthwise-conv backprop the engine can use for a
    Conv2D's per-example gradients is oneDNN's fast kernel there and Eigen's slow one
    elsewhere. Read once: TF fixes the choice when it starts.
    """
    try:
        from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel
        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a TF without the flag's reader: its switch
        return os.environ.get("TF_ENABLE_ONEDNN_OPTS", "") in ("1", "true", "True")
