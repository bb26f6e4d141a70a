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
"""Per-layer gradient handlers: one per layer family, registered against the layer class.

* :mod:`.contract`: what a handler is given (:class:`MicrobatchLayout`, the recorded
  call) and returns (:class:`LayerResult`), and the :class:`Handler` base class;
* :mod:`.registry`: ``register``, ``lookup`` (MRO- and weight-checked), the generic
  fallback ``GENERIC`` and the supported-layers table;
* one module per layer family (dense, conv, ..., rnn_rows, conv_lstm, lora,
  locally_connected), and the layer math they share (rows, rows_path, grouped,
  einsum_equation, the conv patches and the native op).

This ``__init__`` only imports the handler modules (they register themselves) and
re-exports the contract and the registry.

Adding a layer type: a module here with a `Handler` subclass decorated with
`@register(LayerClass)`, imported below, and one ConformanceCase in its family of
tests/conformance_cases.py (run by tests/test_conformance_<family>.py against a float64
reference, and by tests/test_sensitivity.py).
"""

# pylint: disable=unused-import
from tf_tempered.privacy.layer_grads.contract import Handler, LayerResult, MicrobatchLayout
from tf_tempered.privacy.layer_grads.registry import (GENERIC, describe_path,
                                                      handler_for, lookup, register, registered,
                                                      supported_layers_markdown)
# Handlers register themselves on import.
from tf_tempered.privacy.layer_grads import dense  # noqa: F401
from tf_tempered.privacy.layer_grads import conv  # noqa: F401
from tf_tempered.privacy.layer_grads import conv1d  # noqa: F401
from tf_tempered.privacy.layer_grads import conv3d  # noqa: F401
from tf_tempered.privacy.layer_grads import conv_transpose  # noqa: F401
from tf_tempered.privacy.layer_grads import depthwise  # noqa: F401
from tf_tempered.privacy.layer_grads import separable  # noqa: F401
from tf_tempered.privacy.layer_grads import embedding  # noqa: F401
from tf_tempered.privacy.layer_grads import normalization  # noqa: F401
from tf_tempered.privacy.layer_grads import einsum_dense  # noqa: F401
from tf_tempered.privacy.layer_grads import rnn_rows  # noqa: F401  (before rnn: RNN(cell))
from tf_tempered.privacy.layer_grads import conv_lstm  # noqa: F401  (before rnn: ConvLSTM*)
from tf_tempered.privacy.layer_grads import rnn  # noqa: F401
from tf_tempered.privacy.layer_grads import tempered_sigmoid  # noqa: F401
from tf_tempered.privacy.layer_grads import weight_standardized  # noqa: F401
from tf_tempered.privacy.layer_grads import lora  # noqa: F401
from tf_tempered.privacy.layer_grads import locally_connected  # noqa: F401
# pylint: enable=unused-import

__all__ = ["GENERIC", "Handler", "LayerResult", "MicrobatchLayout",
           "describe_path", "handler_for", "lookup", "register", "registered",
           "supported_layers_markdown"]
