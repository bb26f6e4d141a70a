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
"""Grouped convolutions (``groups`` = G > 1) as G independent ungrouped convolutions.

Group j maps input channels [j·cin/G, (j+1)·cin/G) to filters [j·cout/G, (j+1)·cout/G)
with the kernel's slice ``kernel[..., j·cout/G:(j+1)·cout/G]`` (the kernel is
[..., cin/G, cout]) and bias entries. A microbatch's squared gradient norm is the sum
of its groups' and the clipped sums are the groups' concatenated along the filters,
so the ungrouped handler (every path of it: native op, depthwise backprop, patches,
ghost norms) serves each group on its slices of the input and output gradient.
"""

import dataclasses
from typing import Any

from tf_tempered._compat import tf
from tf_tempered.privacy.layer_grads.contract import LayerPath, LayerResult

__all__ = ["GroupedPath", "grouped_norms"]


@dataclasses.dataclass(frozen=True)
class GroupedPath(LayerPath):
    """The groups count and the path the ungrouped handler took for the first group."""
    groups: int
    group_path: Any


class _GroupCall:
    """Group j's slice of a recorded call (what an ungrouped handler reads)."""

    def __init__(self, call, j, groups):
        cin, cout = call.inputs.shape[-1] // groups, call.grad_output.shape[-1] // groups
        self.inputs = call.inputs[..., j * cin:(j + 1) * cin]
        self.grad_output = call.grad_output[..., j * cout:(j + 1) * cout]


def grouped_norms(ungrouped_norms, call, group_params, groups, layout):
    """Norms of a grouped call from ``ungrouped_norms(group_call, group_hparams, layout)``."""
    parts = [ungrouped_norms(_GroupCall(call, j, groups), group_params, layout)
             for j in range(groups)]

    def clipped_sum(weights):
        per_group = [part.clipped_sum(weights) for part in parts]
        return [tf.concat(list(grads), axis=-1) for grads in zip(*per_group)]

    return LayerResult(tf.add_n([part.sq_norms for part in parts]), clipped_sum,
                 GroupedPath(groups, parts[0].path))
