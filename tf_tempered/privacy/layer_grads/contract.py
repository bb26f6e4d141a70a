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
"""The handler contract: what the engine gives a handler and what a handler returns.

A handler (one instance per layer family) turns what the forward pass and the one
backward pass recorded for a layer call (its input ``A``, the gradient ``G`` of the summed
microbatch losses w.r.t. its output, its hyperparameters as plain values) into a
:class:`LayerResult`: the squared norm ``‖g_m‖²`` of each microbatch's gradient of the
layer's own trainable variables, and ``c ↦ Σ_m c_m·g_m`` (the clipped sum for clip
factors ``c``, book-keeping: no second backward pass). :class:`MicrobatchLayout` is
what it needs to know about the step.

This module is a leaf of ``layer_grads``: the registry (:mod:`.registry`) and every
handler import it; it imports none of them.
"""

import dataclasses
from typing import Any, Callable, ClassVar, List, Optional

__all__ = ["FusedClippedSum", "FusedPath", "Handler", "LayerPath", "LayerResult", "MicrobatchLayout",
           "NamedPath", "NoHyperparameters"]


@dataclasses.dataclass(frozen=True)
class MicrobatchLayout:
    """The microbatch layout of the training step, as a handler needs it.

    num_microbatches: M (an int, or a scalar tensor when not known while tracing).
    examples_per_microbatch: E (an int, or None when the batch size is not static).
    options: the model's EngineOptions.
    batch_size: B (an int, or a scalar tensor when not known while tracing).
    xla: the step is compiled by XLA (jit_compile): only ops XLA compiles.
    """
    num_microbatches: Any
    examples_per_microbatch: Any
    options: Any
    batch_size: Any = None
    xla: bool = False


@dataclasses.dataclass(frozen=True)
class LayerPath:
    """Base of every handler's path: the frozen decision object of how it computed a call
    (e.g. rows.RowsPath: ghost norm or materialized gradients), read by ``layer_paths``."""


@dataclasses.dataclass(frozen=True)
class NamedPath(LayerPath):
    """A path with nothing to decide, by name ("generic", "sparse", ...)."""
    name: str


@dataclasses.dataclass(frozen=True)
class FusedPath(LayerPath):
    """The path of the layer whose FusedClippedSum the engine ran (its handler's path ``of``)."""
    of: LayerPath


@dataclasses.dataclass(frozen=True)
class NoHyperparameters:
    """The hyperparameters of a handler that needs none beyond the recorded tensors."""


@dataclasses.dataclass(frozen=True, eq=False)
class FusedClippedSum:
    """A layer's norms and clipped sum in one pass, once every other layer's norms are known.

    run: (S [M] float32, the other layers' summed squared norms; C) → (its own squared
      norms n [M], the clip factors c_m = C / max(√(S_m + n_m), C) [M] float32 (0 where
      not finite), [Σ_m c_m·g_m for each of its variables]). The engine uses that c for
      every layer.
    cost: multiply-adds its separate clipped sum would take; the engine fuses the
      costliest such layer of a step (one only: its c needs all the others' norms).
    """
    run: Callable[[Any, float], Any]
    cost: int


@dataclasses.dataclass(frozen=True, eq=False)
class LayerResult:
    """A handler's result for one layer call.

    sq_norms: [M] squared norms of the microbatches' gradients of `variables`.
    clipped_sum: ClipWeights → [Σ_m c_m·g_m for each variable of `variables`,
      in that order] (a tensor, or tf.IndexedSlices for a sparse gradient).
    path: the path the handler took (its own frozen decision object), for
      inspection and tests.
    variables: the variables `clipped_sum` returns gradients for, when they are
      not `handler.variables(layer, hparams)` (multi_call: all the layer's own).
    fused: a FusedClippedSum the engine may run instead of `sq_norms` and `clipped_sum`
      (then the op behind sq_norms is never run: nothing depends on it).
    """
    sq_norms: Any
    clipped_sum: Callable[[Any], List[Any]]
    path: Optional[LayerPath] = None
    variables: Any = None
    fused: Optional[FusedClippedSum] = None

    def __post_init__(self):
        if self.path is not None and not isinstance(self.path, LayerPath):
            raise TypeError(f"LayerResult.path must be a LayerPath, got {self.path!r}.")
        if self.fused is not None and not isinstance(self.fused, FusedClippedSum):
            raise TypeError(f"LayerResult.fused must be a FusedClippedSum, got {self.fused!r}.")


class Handler:
    """Base class of the per-layer handlers (stateless: one instance per family)."""

    name: ClassVar[str] = None  # short name for messages, logs and tests ("dense", ...)
    summary: ClassVar[str] = None  # one line for the supported-layers table

    # Capabilities (class constants; the engine reads them, each False by default):
    # recording bypasses the layer's activation, so that the recorded output is the
    # pre-activation Z (the handler's math is for Z = f(A, W)).
    records_pre_activation: ClassVar[bool] = False
    # A per-example VJP of the layer's own recorded call (rnn.py): exact for any
    # subclass, so it also applies to subclasses that override `call`.
    vjp_of_own_call: ClassVar[bool] = False
    # That VJP slices the tensors among the call's other arguments (mask, initial
    # states) per example too (generic.per_example_grads).
    slices_call_args: ClassVar[bool] = False
    # The handler's math sums over rows that may be several per example, example-major
    # ([B·K, ...], as Keras 2's TimeDistributed gives its layer): a layer called K times
    # per step (Keras 3's TimeDistributed, a shared layer) then becomes one such call
    # (multi_call.py) instead of K per-example VJPs.
    sums_rows_per_example: ClassVar[bool] = False
    # The handler runs the layer's call itself (`recorded_call`, rnn_rows.py) to record
    # tensors of its own choosing instead of the layer's input and output.
    records_own_forward: ClassVar[bool] = False

    def per_example_while_loop(self, options):
        """Whether the generic per-example VJP of this handler's calls must be a tf.map_fn
        over the examples instead of a vectorized map (EngineOptions ``options``)."""
        del options
        return False

    def hyperparameters(self, layer):
        """Plain values of `layer` the handler needs (its own frozen dataclass;
        NoHyperparameters if none), or None if it does not cover this configuration."""
        raise NotImplementedError

    def variables(self, layer, hparams):
        """The trainable variables `layer_result(...).clipped_sum` returns gradients for, in order.

        ``hparams``: what :meth:`hyperparameters` returned for the layer."""
        raise NotImplementedError

    def layer_result(self, call, hparams, layout):
        """The LayerResult of one recorded call (`call.inputs`, `call.grad_output`)."""
        raise NotImplementedError

    def recorded_call(self, layer, hparams, call_fn, inputs, args, kwargs, wrap, options=None):
        """(outputs, recorded inputs, recorded output) of a call the handler runs itself,
        with `wrap` applied to the recorded output before it is used; or None to leave
        the call to the next handler (only if records_own_forward). ``options``: the
        step's EngineOptions (None: the defaults), e.g. whether native ops may run."""
        raise NotImplementedError

    def merge_calls(self, calls):
        """One call-like record for a layer called several times, or None (multi_call.py
        then sums per-example VJPs of the calls)."""
        del calls
        return None
