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
"""PyTorch (CPU) peers of benchmarks/dp_step.py: Opacus's DP-SGD step against its own
non-private step, all paths in ONE process, on the same models and shapes.

Models (synthetic inputs of the real shapes, as dp_step.py):
  mnist  the paper's MNIST CNN (tf_tempered.models.mnist_cnn, tanh, 26,010 parameters):
         Conv2d 16 8×8 stride 2 (Keras 'same' = 3 pixels each side at 28×28), MaxPool 2
         stride 1, Conv2d 32 4×4 stride 2, MaxPool 2 stride 1, Linear 32, Linear 10
  text   dp_step.py's text classifier: Embedding 50 000 × 64, one post-norm Transformer
         encoder block (4-head attention, LayerNorm, tanh MLP 128), mean pool, Linear 10

Paths (SGD, learning rate 0.15, mean cross-entropy; the DP ones clip each example's whole
gradient to L2 norm 1.0 and add Gaussian noise of std noise_multiplier × 1.0 to the sum,
then divide by the batch size; a fixed batch, no Poisson sampling):
  nonprivate    torch.optim.SGD on the mean loss (the baseline of every ratio)
  opacus        Opacus PrivacyEngine.make_private (grad_sample_mode="hooks", the default):
                per-example gradients by module hooks (nn.MultiheadAttention replaced by
                Opacus's DPMultiheadAttention, as ModuleValidator.fix does); the Embedding's
                per-example gradient is a dense [B, 50 000, 64] tensor
  opacus_ghost  the same with grad_sample_mode="ghost" (ghost clipping: per-example norms
                without per-example gradients, then a second backward pass)
  torch_func    torch.func: vmap(grad(functional_call)) per-example gradients, clipped and
                summed by hand, then torch.optim.SGD; the model with DPMultiheadAttention too
                (torch.func has no batching rule for nn.MultiheadAttention's CPU flash
                attention and would loop over the examples)

    python benchmarks/peers/opacus_step.py --model=mnist
    python benchmarks/peers/opacus_step.py --model=text --steps=2 --rounds=5
    python benchmarks/peers/opacus_step.py --model=text --selfcheck

--selfcheck runs no timing: on 4 examples it checks each DP path's update against a
per-example loop of plain autograd (noise 0, clip norm the median per-example norm so that
both sides of the clip are hit), the noise's std with noise 1, and that the non-private step
lowers the loss.
"""

import copy
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # pylint: disable=wrong-import-position

if __name__ == "__main__":  # before torch is imported (below)
    _common.require("torch", "opacus")

# pylint: disable=wrong-import-position
import importlib.metadata
import warnings

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

# The models' first layer takes no input gradient; Opacus's hooks say so on every step.
warnings.filterwarnings("ignore", message="Full backward hook is firing")

PATHS = ("nonprivate", "opacus", "opacus_ghost", "torch_func")
# The paths whose model takes Opacus's module replacements (ModuleValidator.fix).
DP_MODULE_PATHS = ("opacus", "opacus_ghost", "torch_func")


def mnist_cnn():
    """The paper's MNIST CNN in PyTorch (NCHW; see the module docstring)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, stride=1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, stride=1),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 32), nn.Tanh(), nn.Linear(32, _common.NUM_CLASSES))


class TextClassifier(nn.Module):
    """dp_step.py's text classifier: Embedding + one post-norm Transformer encoder block."""

    def __init__(self):
        super().__init__()
        dim = _common.TEXT_DIM
        self.embedding = nn.Embedding(_common.TEXT_VOCAB, dim)
        self.attention = nn.MultiheadAttention(dim, _common.TEXT_HEADS, batch_first=True)
        self.norm1 = nn.LayerNorm(dim, eps=1e-3)  # Keras's default epsilon
        self.hidden = nn.Linear(dim, 2 * dim)
        self.output = nn.Linear(2 * dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-3)
        self.logits = nn.Linear(dim, _common.NUM_CLASSES)

    def forward(self, tokens):
        x = self.embedding(tokens)
        attended, _ = self.attention(x, x, x, need_weights=False)
        x = self.norm1(x + attended)
        x = self.norm2(x + self.output(torch.tanh(self.hidden(x))))
        return self.logits(x.mean(dim=1))


def build_model(kind, path):
    """A fresh model; for the DP paths with Opacus's module replacements applied."""
    model = TextClassifier() if kind == "text" else mnist_cnn()
    if path in DP_MODULE_PATHS:
        from opacus.validators import ModuleValidator  # pylint: disable=import-outside-toplevel
        model = ModuleValidator.fix(model)
    return model


def tensors(kind, batch_size, seed=0):
    """The synthetic batch as torch tensors; images NCHW in the default (contiguous) memory
    format, as torchvision's loaders give them. (A permuted NHWC array of one channel has
    strides that torch reads as channels_last, which Opacus 1.6's conv per-example gradients
    (opacus.utils.tensor_utils.unfold2d, written for contiguous NCHW) get wrong.)"""
    x, y = _common.synthetic_batch(kind, batch_size, seed)
    x = torch.from_numpy(x)
    if kind != "text":
        x = x.permute(0, 3, 1, 2).clone(memory_format=torch.contiguous_format)
    return x, torch.from_numpy(y)


# Every step sets its gradients to None when it is done (not when the next step starts), so
# that what a path would keep between steps (Opacus: the per-example gradients, for the
# Embedding [B, 50 000, 64]) does not count in the peak RSS of the path timed after it.


def nonprivate_step(model, x, y, learning_rate, **_):
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)

    def step():
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)  # at the end: see above
        return float(loss.detach())
    return step


def opacus_step(model, x, y, learning_rate, noise_multiplier, clip, ghost=False):
    """Opacus's step, set up as its tutorials do (PrivacyEngine.make_private), with a data
    loader of the one fixed batch and poisson_sampling=False (so the expected batch is B)."""
    from opacus import PrivacyEngine  # pylint: disable=import-outside-toplevel
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                         batch_size=len(x))
    optimizer = torch.optim.SGD(model.parameters(), lr=learning_rate)
    extra = dict(criterion=nn.CrossEntropyLoss(), grad_sample_mode="ghost") if ghost else {}
    with warnings.catch_warnings():  # secure_mode and accountant warnings
        warnings.simplefilter("ignore")
        made = PrivacyEngine().make_private(
            module=model, optimizer=optimizer, data_loader=loader, poisson_sampling=False,
            noise_multiplier=noise_multiplier, max_grad_norm=clip, **extra)
    private_model, dp_optimizer = made[0], made[1]
    criterion = made[2] if ghost else nn.CrossEntropyLoss()

    def step():
        loss = criterion(private_model(x), y)
        loss.backward()
        dp_optimizer.step()
        dp_optimizer.zero_grad(set_to_none=True)  # also drops the per-example gradients
    return step


def torch_func_step(model, x, y, learning_rate, noise_multiplier, clip):
    """Per-example gradients by torch.func.vmap(grad(...)) of the loss of one example."""
    from torch.func import functional_call, grad, vmap  # pylint: disable=import-outside-toplevel
    params = dict(model.named_parameters())
    optimizer = torch.optim.SGD(params.values(), lr=learning_rate)

    def example_loss(weights, xi, yi):
        return F.cross_entropy(functional_call(model, weights, (xi[None],)), yi[None])

    per_example_grads = vmap(grad(example_loss), in_dims=(None, 0, 0))

    def step():
        grads = per_example_grads({k: v.detach() for k, v in params.items()}, x, y)
        norms = torch.stack([g.flatten(1).norm(dim=1) for g in grads.values()]).norm(dim=0)
        factors = (clip / (norms + 1e-6)).clamp(max=1.0)
        for name, param in params.items():
            clipped_sum = torch.einsum("b,b...->...", factors, grads[name])
            noise = torch.randn_like(clipped_sum) * (noise_multiplier * clip)
            param.grad = (clipped_sum + noise) / len(x)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


STEPS = {"nonprivate": nonprivate_step, "opacus": opacus_step,
         "opacus_ghost": lambda *a, **k: opacus_step(*a, **k, ghost=True),
         "torch_func": torch_func_step}


def flat_parameters(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()]).numpy().copy()


def per_example_gradients(model, x, y):
    """[B, P]: each example's gradient by plain autograd, one example at a time."""
    rows = []
    for i in range(len(x)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i:i + 1]), y[i:i + 1]).backward()
        rows.append(torch.cat([p.grad.flatten() for p in model.parameters()]).numpy().copy())
    return np.stack(rows)


def selfcheck_path(kind, path, batch_size=4):
    """The DP path's update (learning rate 1) against the per-example loop."""
    x, y = tensors(kind, batch_size, seed=1)
    torch.manual_seed(0)
    initial = build_model(kind, path)
    grads = per_example_gradients(copy.deepcopy(initial), x, y)
    norms = np.linalg.norm(grads, axis=1)
    clip = float(np.median(norms))
    factors = np.minimum(1.0, clip / (norms + 1e-6))
    expected = -(factors @ grads) / batch_size
    results = []
    for noise_multiplier in (0.0, 1.0):
        model = copy.deepcopy(initial)
        step = STEPS[path](model, x, y, learning_rate=1.0, noise_multiplier=noise_multiplier,
                           clip=clip)
        before = flat_parameters(model)
        step()
        delta = flat_parameters(model) - before
        if noise_multiplier == 0:
            shown = ", ".join(f"{n:.3f}" for n in norms)
            results.append(_common.check_close(
                f"{kind} {path} clipped sum (norms {shown}; clip {clip:.3f})", delta, expected))
        else:
            results.append(_common.check_noise_std(f"{kind} {path}", float(np.std(
                delta - expected)), clip / batch_size))
    return results


def selfcheck(args, paths):
    results = []
    for path in paths:
        if path == "nonprivate":
            x, y = tensors(args.model, 16, seed=2)
            torch.manual_seed(0)
            step = nonprivate_step(build_model(args.model, path), x, y, _common.LEARNING_RATE)
            results.append(_common.check_trains(f"{args.model} nonprivate",
                                                [step() for _ in range(31)]))
        else:
            results += selfcheck_path(args.model, path)
    _common.finish_selfcheck(results)


def versions():
    return {"torch": torch.__version__, "opacus": importlib.metadata.version("opacus"),
            "torch_threads": torch.get_num_threads()}


def build_step(args, path):
    """The step of ``path`` on a fixed batch, as a no-argument callable."""
    x, y = tensors(args.model, args.batch_size)
    torch.manual_seed(0)
    return STEPS[path](build_model(args.model, path), x, y, learning_rate=_common.LEARNING_RATE,
                       noise_multiplier=args.noise_multiplier, clip=_common.L2_NORM_CLIP)


def main():
    _common.run(__doc__.splitlines()[0], PATHS, versions=versions, selfcheck=selfcheck,
                build_step=build_step, title="PyTorch (CPU)")


if __name__ == "__main__":
    main()
