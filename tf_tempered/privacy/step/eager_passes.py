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
"""The passes of a step run eagerly (``run_eagerly=True``, a DPGradients called outside
tf.function): stages 3-7 run as a function traced for that step, so the checks that read
the traced graph read what runs.

Three refusals read the graph a traced DP step builds: a weight read outside its layer's
call (:func:`tf_tempered.privacy.coverage.refuse_reads_outside_calls`), a layer called on
rows that are not the batch's (:mod:`tf_tempered.privacy.example_rows`) and a write of the
batch into a variable. Eagerly there is no graph: a tied embedding trained with its tied
use's gradient missing. Checked on a trace of the first step only, a flag flipped later (a
callback, a warm-up) trained unchecked (probe D3, F1: one example moved the update 9-14 C);
checked on a separate trace of every step beside an eager pass, the layers' Python ran twice
and a branch on ``tf.executing_eagerly()`` or a call counter trained what the trace did not
take (probe G3, F1: 8.87 C). So the step's passes
are the traced function itself, traced anew each step (a layer's Python may change between
steps) and run once: layers see symbolic tensors in their call, as in a step without
run_eagerly. The noise, the update and the metrics stay eager.
Its cost: a small model's eager step 5-8x the same passes run eagerly unchecked, 40-60x a traced
step, on 2 CPU cores (benchmarks/eager_checks.py; run_eagerly is for debugging).

>>> import dataclasses
>>> [field.name for field in dataclasses.fields(Passes)]
['summed', 'local_stats', 'total', 'rows', 'y_pred']
"""

import dataclasses
import itertools
import random
import weakref

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy.errors import UnsupportedLayerError
from tf_tempered.privacy.step.batch import unpack_batch
from tf_tempered.privacy.step.chunks import Passes, clipped_passes
from tf_tempered.privacy.step.plan import plan_step

__all__ = ["traced_passes"]


@tf.autograph.experimental.do_not_convert
def traced_passes(model, state, data, losses):
    """The :class:`Passes` of ``model``'s eager step on ``data``, from stages 3-7 traced (the
    graph-reading checks raise there) and run as one function. ``losses``: DPGradients'
    loss container, or None."""

    def passes_of(traced_data):
        _vary_graph_seed(tf.compat.v1.get_default_graph(), model)
        plan = plan_step(model, state, check_optimizer=losses is None)
        batch = unpack_batch(traced_data, xla=plan.xla,
                             input_shapes=keras_bridge.declared_input_shapes(model))
        passes = clipped_passes(model, state, plan, batch, losses=losses)
        return tuple(getattr(passes, field.name) for field in dataclasses.fields(Passes))

    try:
        # Its custom gradients are used inside the trace only: TF's registry would keep
        # every step's graphs (probe G3, F2).
        # A concrete function runs as a graph also under tf.config.run_functions_eagerly(True),
        # which a tf.function called directly obeys: then no graph, and no check, at all
        # (probe H1, F1: a batch centering trained, 7.95 C).
        with keras_bridge.custom_gradients_dropped():
            step = tf.function(passes_of, autograph=False).get_concrete_function(data)
            return Passes(*step(data))
    except (NotImplementedError, tf.errors.OperatorNotAllowedInGraphError,
            AttributeError) as failure:
        # Code that runs only eagerly (numpy of a tensor, a Python bool of one, a tensor's
        # .numpy()) failed here with TF's own error, naming no fix (probes D3, F2; H1, F5).
        if isinstance(failure, AttributeError) and "numpy" not in str(failure):
            raise
        raise UnsupportedLayerError(_EAGER_ONLY.format(failure=failure)) from failure


# Each model's traces so far: each step's graph gets its own seed from the count.
_TRACES = weakref.WeakKeyDictionary()


def _vary_graph_seed(graph, model):
    """Under a global seed (keras.utils.set_random_seed), TF seeds a graph's random ops from
    it and their position in the graph: the same ops, traced anew each step, drew the same
    numbers every step (tf-keras' Dropout, a custom layer's tf.random; probe H1, F3). Each
    trace's graph seed is the global one moved by the number of the model's trace, so two
    runs of the same seed in one process draw alike (a count over all models made the second
    differ; probe H4, F5). Without a global seed an op's own seed (``tf.random.normal(...,
    seed=5)``) drew one mask every step (H4, F4): the graph gets a seed from the OS."""
    if graph.seed is None:
        graph.seed = random.SystemRandom().randrange(2 ** 31 - 1)
        return
    traces = _TRACES.setdefault(model, itertools.count(1))
    graph.seed = (graph.seed + next(traces) * 1_000_003) % (2 ** 31 - 1)


_EAGER_ONLY = (
    "A DP step run eagerly runs its forward and backward passes as a function traced for "
    "that step, so that the checks that read its graph (that no layer mixes the batch's "
    "examples, no weight is read outside its layer's call, no data is written into a "
    "variable) check what runs, and the trace failed: a layer's call runs only on eager "
    "tensors ({failure}). Fix: write that call with TensorFlow ops (tf.sign instead of "
    "np.sign(np.asarray(t)), tf.cond or tf.where instead of a Python if on a tensor), as "
    "fit without run_eagerly=True needs anyway.")
