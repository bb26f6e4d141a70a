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
"""Checks of the data a private model's ``fit`` is given, before it is planned
(:mod:`~tf_tempered.privacy.fit_data`): refusals that name the fix, and warnings of what
the data's form costs."""

import warnings

from tf_tempered._compat import tf
from tf_tempered import keras_bridge
from tf_tempered.privacy import class_weights, data_sampling, user_frame

__all__ = ["refuse_poisson_batches_without_info",
           "refuse_poisson_batches_of_one_device", "warn_if_order_asked",
           "warn_if_xla_meets_varying_batches"]


def warn_if_order_asked(state, shuffle):
    """fit(shuffle=False or "batch") on arrays under Poisson sampling: each step draws its
    own batch, so no order is kept (probe U, F5: said nothing)."""
    asked = isinstance(shuffle, str) or not shuffle  # "batch", False (np.True_, 1: True)
    if not asked or "order under poisson" in state.warned:
        return
    state.warned.add("order under poisson")
    warnings.warn(
        f"fit(shuffle={shuffle!r}) on arrays of a private model: its batches are Poisson "
        "samples (each example joins each step with probability q), so no order of the "
        "examples is kept. Fix, for batches in order (a time series, a stateful RNN): "
        "make_private(model, ..., sampling=\"shuffle\") and fit(shuffle=False), accounted "
        "with the bound for shuffled batches (no amplification).", UserWarning,
        stacklevel=user_frame.user_stacklevel())


def refuse_poisson_batches_without_info(x):
    """Batches of poisson_batches whose info dict a transformation dropped or replaced
    (``.map(lambda x, y, info: (x, y))``): the step would take the padding rows for
    examples and divide by the rows a batch holds, not q·N, so one example could move the
    clipped sum by 2C, not the C the Poisson ε assumes (probe U, F1/F2)."""
    dataset = keras_bridge.source_dataset(x)
    if (isinstance(dataset, tf.data.Dataset) and not class_weights.is_poisson_pipeline(dataset)
            and data_sampling.made_from_poisson_batches(dataset)):
        raise ValueError(
            "fit on batches of tf_tempered.privacy.poisson_batches whose info dict (each "
            "batch's third element, {\"mask\", \"expected_batch_size\"}) a transformation "
            f"dropped or replaced (element structure {dataset.element_spec}): the step "
            "would train on the padding rows as examples and divide by the rows a batch "
            "holds instead of the expected batch size, a wrong update outside the ε. Fix: "
            "keep it as the third element, e.g. .map(lambda x, y, info: (augment(x), y, "
            "info)); for per-example weights, poisson_batches(x, y, sample_weight=...).")


def refuse_poisson_batches_of_one_device(model, x, tag):
    """poisson_batches under a strategy of several replicas: Keras would split each padded
    batch (and its scalar expected batch size) among them, and fails deep in tf.distribute."""
    replicas = model.distribute_strategy.num_replicas_in_sync
    poisson = (tag is not None and tag.kind == "poisson") or (
        tag is None and class_weights.is_poisson_pipeline(x))  # built by hand
    if (poisson and replicas > 1
            and isinstance(keras_bridge.source_dataset(x), tf.data.Dataset)):
        raise ValueError(
            f"fit on Poisson batches (tf_tempered.privacy.poisson_batches(...), or (x, y, "
            f"{{\"mask\": ...}}) batches) under a tf.distribute strategy "
            f"of {replicas} replicas: its padded batches are drawn for one device. Fix: "
            "tf_tempered.privacy.distributed_poisson_batches(strategy, x, y, "
            "expected_batch_size=..., steps=...), which draws each replica's Poisson batch "
            "from its shard, or batches of your own per replica by "
            "strategy.distribute_datasets_from_function (docs/distributed.md).")


def warn_if_xla_meets_varying_batches(model, state, tag):
    """Unpadded Poisson batches under jit_compile=True: one XLA compilation per size met."""
    if (tag is None or tag.fixed_size or not keras_bridge.jit_compiled(model)
            or "xla varying batches" in state.warned):
        return
    state.warned.add("xla varying batches")
    warnings.warn(
        "fit on poisson_batches(fixed_size=False) with jit_compile=True: XLA compiles the "
        "step once for every batch size it meets (dozens of sizes; a 2-layer model trained "
        "about 20x slower over 80 steps). Fix: poisson_batches(fixed_size=True), the default, or "
        "compile(jit_compile=False).", UserWarning,
        stacklevel=user_frame.user_stacklevel())
