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
"""Dense: rows are the examples × any sequence positions of a [B, ..., d_in] input."""

import dataclasses
from typing import Tuple

from tf_tempered._compat import keras
from tf_tempered import keras_bridge
from tf_tempered.privacy.layer_grads import rows
from tf_tempered.privacy.layer_grads.contract import Handler
from tf_tempered.privacy.layer_grads.registry import register

__all__ = ["DenseHandler", "DenseHyperparameters"]


@dataclasses.dataclass(frozen=True)
class DenseHyperparameters:
    """Plain hyperparameters of a Dense layer."""
    name: str
    use_bias: bool
    kernel_shape: Tuple[int, int]


@register(keras.layers.Dense)
class DenseHandler(Handler):
    """Ghost norm or materialized per-microbatch gradients, by rows.choose_materialize."""

    name = "dense"
    summary = ("inputs [B, ..., d]: ghost norm or materialized per-microbatch gradients, whichever "
               "is cheaper for the shape; bias from the output gradients; book-keeping clipped sum")
    records_pre_activation = True
    sums_rows_per_example = True

    def hyperparameters(self, layer):
        if keras_bridge.derived_weights(layer):  # Keras 3 LoRA (lora.py) / quantized (generic)
            return None
        return DenseHyperparameters(layer.name, bool(layer.use_bias),
                                    keras_bridge.shape_of(layer.kernel))

    def variables(self, layer, hparams):
        return [layer.kernel, layer.bias] if hparams.use_bias else [layer.kernel]

    def layer_result(self, call, hparams, layout):
        src = rows.RowSource(call.inputs, call.grad_output, call.inputs.shape[-1], layout.options)
        path = rows.RowsPath(rows.choose_materialize(src, layout.num_microbatches,
                                                     layout.examples_per_microbatch))
        return rows.linear_norms(src, path, layout, kernel_shape=hparams.kernel_shape,
                                 use_bias=hparams.use_bias)
