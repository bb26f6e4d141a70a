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
"""Opacus' per-example convolution gradients against a per-example loop, NCHW and channels_last.

Found by opacus_step.py --selfcheck (Opacus 1.6.0, torch 2.13 CPU): with a channels_last input the
per-example gradients of both convolutions differ from the loop's by as much as the gradients
themselves, without an error; with a contiguous (NCHW) input they agree to 1e-7. Printed per
memory format and layer: the largest difference and the largest gradient value.

    python benchmarks/peers/opacus_channels_last.py
"""
import copy

import torch
from torch import nn
from torch.nn import functional as F
from opacus import GradSampleModule
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Tanh(), nn.Conv2d(8, 4, 3), nn.Flatten(), nn.Linear(144, 2))
y = torch.tensor([0, 1])
for fmt in (torch.contiguous_format, torch.channels_last):
    x = torch.randn(2, 3, 10, 10).to(memory_format=fmt)
    ref = copy.deepcopy(model)
    loop = [torch.autograd.grad(F.cross_entropy(ref(x[i:i+1]), y[i:i+1]), [ref[0].weight, ref[2].weight]) for i in range(2)]
    gsm = GradSampleModule(copy.deepcopy(model))
    F.cross_entropy(gsm(x), y).backward()
    for j, k in ((0, 0), (1, 2)):
        want = torch.stack([g[j] for g in loop])
        print(fmt, f"conv{j+1}", "max |opacus - loop|", f"{(gsm._module[k].weight.grad_sample - want).abs().max().item():.2e}", "scale", f"{want.abs().max().item():.2e}")
