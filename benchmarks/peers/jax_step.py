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
"""JAX (CPU) peer of benchmarks/dp_step.py: vmap DP-SGD against its own non-private step,
both jit-compiled, in ONE process, on the same models and shapes. Plain JAX: the models,
the loss and SGD are written here (no flax, no optax).

Models (synthetic inputs of the real shapes, as dp_step.py):
  mnist  the paper's MNIST CNN (tf_tempered.models.mnist_cnn, tanh, 26,010 parameters),
         NHWC: Conv 16 8×8 stride 2 SAME, max pool 2 stride 1, Conv 32 4×4 stride 2 VALID,
         max pool 2 stride 1, Dense 32, Dense 10
  text   dp_step.py's text classifier: Embedding 50 000 × 64, one post-norm Transformer
         encoder block (4-head attention, LayerNorm, tanh MLP 128), mean pool, Dense 10

Paths (SGD, learning rate 0.15, mean cross-entropy; each step one jax.jit call with the
parameters donated):
  nonprivate  jax.grad of the mean loss (the baseline of every ratio)
  jax_vmap    DP-SGD as in JAX's examples/differentially_private_sgd.py: jax.vmap(jax.grad)
              of one example's loss gives every per-example gradient (for the Embedding a
              dense [B, 50 000, 64] array), each example's whole gradient clipped to L2 norm
              1.0, summed, Gaussian noise of std noise_multiplier × 1.0 added, divided by B

    python benchmarks/peers/jax_step.py --model=mnist
    python benchmarks/peers/jax_step.py --model=text --steps=2 --rounds=5
    python benchmarks/peers/jax_step.py --model=text --selfcheck

--selfcheck runs no timing: on 4 examples it checks jax_vmap's update against a loop of
jax.grad over the examples (noise 0, clip norm the median per-example norm so that both
sides of the clip are hit), the noise's std with noise 1, and that the non-private step
lowers the loss.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common  # pylint: disable=wrong-import-position

if __name__ == "__main__":  # before jax is imported (below)
    _common.require("jax")

# pylint: disable=wrong-import-position
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

PATHS = ("nonprivate", "jax_vmap")


def _dense_params(key, fan_in, fan_out):
    """Keras's defaults: Glorot-uniform kernel, zero bias."""
    limit = np.sqrt(6 / (fan_in + fan_out))
    return {"w": jax.random.uniform(key, (fan_in, fan_out), minval=-limit, maxval=limit),
            "b": jnp.zeros(fan_out)}


def _conv_params(key, size, channels_in, channels_out):
    limit = np.sqrt(6 / (size * size * (channels_in + channels_out)))
    return {"w": jax.random.uniform(key, (size, size, channels_in, channels_out),
                                    minval=-limit, maxval=limit),
            "b": jnp.zeros(channels_out)}


def _norm_params(dim):  # distinct arrays: the parameters are donated to each step
    return {"scale": jnp.ones(dim), "offset": jnp.zeros(dim)}


def init_params(kind, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 8)
    if kind == "mnist":
        return {"conv1": _conv_params(keys[0], 8, 1, 16), "conv2": _conv_params(keys[1], 4, 16, 32),
                "dense1": _dense_params(keys[2], 32 * 4 * 4, 32),
                "logits": _dense_params(keys[3], 32, _common.NUM_CLASSES)}
    dim = _common.TEXT_DIM
    return {"embedding": jax.random.uniform(keys[0], (_common.TEXT_VOCAB, dim),
                                            minval=-0.05, maxval=0.05),
            "attention": {name: _dense_params(key, dim, dim)
                          for name, key in zip(("query", "key", "value", "out"), keys[1:5])},
            "norm1": _norm_params(dim), "norm2": _norm_params(dim),
            "hidden": _dense_params(keys[5], dim, 2 * dim),
            "output": _dense_params(keys[6], 2 * dim, dim),
            "logits": _dense_params(keys[7], dim, _common.NUM_CLASSES)}


def _dense(p, x):
    return x @ p["w"] + p["b"]


def _conv(p, x, stride, padding):
    return lax.conv_general_dilated(x, p["w"], (stride, stride), padding,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC")) + p["b"]


def _max_pool(x):  # 2×2, stride 1, VALID
    return lax.reduce_window(x, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 1, 1, 1), "VALID")


def mnist_forward(params, images):
    x = _max_pool(jnp.tanh(_conv(params["conv1"], images, 2, "SAME")))
    x = _max_pool(jnp.tanh(_conv(params["conv2"], x, 2, "VALID")))
    x = jnp.tanh(_dense(params["dense1"], x.reshape(x.shape[0], -1)))
    return _dense(params["logits"], x)


def _layer_norm(p, x, epsilon=1e-3):  # Keras's default epsilon
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * lax.rsqrt(variance + epsilon) * p["scale"] + p["offset"]


def _attention(p, x, heads=_common.TEXT_HEADS):
    batch, length, dim = x.shape
    q, k, v = (_dense(p[name], x).reshape(batch, length, heads, dim // heads)
               for name in ("query", "key", "value"))
    weights = jax.nn.softmax(jnp.einsum("blhd,bmhd->bhlm", q, k) / np.sqrt(dim // heads))
    attended = jnp.einsum("bhlm,bmhd->blhd", weights, v).reshape(batch, length, dim)
    return _dense(p["out"], attended)


def text_forward(params, tokens):
    x = jnp.take(params["embedding"], tokens, axis=0)
    x = _layer_norm(params["norm1"], x + _attention(params["attention"], x))
    hidden = jnp.tanh(_dense(params["hidden"], x))
    x = _layer_norm(params["norm2"], x + _dense(params["output"], hidden))
    return _dense(params["logits"], x.mean(1))


FORWARD = {"mnist": mnist_forward, "text": text_forward}


def example_losses(forward, params, x, y):
    """Cross-entropy of each example of the batch."""
    logits = jax.nn.log_softmax(forward(params, x))
    return -jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]


def make_nonprivate_step(forward, learning_rate):
    """jit(params, x, y, key) -> (params, key, loss): SGD on the mean loss."""
    def step(params, x, y, key):
        loss, grads = jax.value_and_grad(
            lambda p: example_losses(forward, p, x, y).mean())(params)
        return jax.tree.map(lambda p, g: p - learning_rate * g, params, grads), key, loss
    return jax.jit(step, donate_argnums=0)


def clipped_noisy_mean(grads, key, noise_multiplier, clip):
    """Per-example gradients (a tree of [B, ...]) -> (sum of clipped + noise) / B, and key."""
    leaves, treedef = jax.tree.flatten(grads)
    batch = leaves[0].shape[0]
    norms = jnp.sqrt(sum(jnp.sum(g.reshape(batch, -1) ** 2, axis=1) for g in leaves))
    factors = jnp.minimum(1.0, clip / (norms + 1e-6))
    key, *keys = jax.random.split(key, len(leaves) + 1)
    means = [(jnp.tensordot(factors, g, axes=1)
              + noise_multiplier * clip * jax.random.normal(k, g.shape[1:], g.dtype)) / batch
             for g, k in zip(leaves, keys)]
    return jax.tree.unflatten(treedef, means), key


def make_vmap_step(forward, learning_rate, noise_multiplier, clip):
    """jit(params, x, y, key) -> (params, key, None): DP-SGD by vmap(grad)."""
    def example_loss(params, xi, yi):
        return example_losses(forward, params, xi[None], yi[None])[0]

    per_example_grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))

    def step(params, x, y, key):
        update, key = clipped_noisy_mean(per_example_grads(params, x, y), key,
                                         noise_multiplier, clip)
        return jax.tree.map(lambda p, u: p - learning_rate * u, params, update), key, None
    return jax.jit(step, donate_argnums=0)


def make_step(path, kind, learning_rate, noise_multiplier, clip):
    if path == "nonprivate":
        return make_nonprivate_step(FORWARD[kind], learning_rate)
    return make_vmap_step(FORWARD[kind], learning_rate, noise_multiplier, clip)


def arrays(kind, batch_size, seed=0):
    x, y = _common.synthetic_batch(kind, batch_size, seed)
    return jnp.asarray(x.astype(np.int32) if kind == "text" else x), jnp.asarray(y.astype(np.int32))


class Runner:
    """Holds a path's parameters and key between steps; ``()`` runs one step to completion."""

    def __init__(self, jitted, params, x, y, seed=0):
        self.jitted, self.params, self.x, self.y = jitted, params, x, y
        self.key = jax.random.PRNGKey(seed)

    def __call__(self):
        self.params, self.key, loss = self.jitted(self.params, self.x, self.y, self.key)
        jax.block_until_ready(self.params)
        return None if loss is None else float(loss)


def _flat(params):
    return np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree.leaves(params)])


def selfcheck_vmap(kind, batch_size=4):
    """jax_vmap's update (learning rate 1) against a loop of jax.grad over the examples."""
    x, y = arrays(kind, batch_size, seed=1)
    forward = FORWARD[kind]
    grads = np.stack([_flat(jax.grad(lambda p, i=i: example_losses(
        forward, p, x[i:i + 1], y[i:i + 1])[0])(init_params(kind))) for i in range(batch_size)])
    norms = np.linalg.norm(grads, axis=1)
    clip = float(np.median(norms))
    expected = -(np.minimum(1.0, clip / (norms + 1e-6)) @ grads) / batch_size
    results = []
    for noise_multiplier in (0.0, 1.0):
        before = _flat(init_params(kind))
        runner = Runner(make_vmap_step(forward, 1.0, noise_multiplier, clip),
                        init_params(kind), x, y)
        runner()
        delta = _flat(runner.params) - before
        if noise_multiplier == 0:
            shown = ", ".join(f"{n:.3f}" for n in norms)
            results.append(_common.check_close(
                f"{kind} jax_vmap clipped sum (norms {shown}; clip {clip:.3f})", delta, expected))
        else:
            results.append(_common.check_noise_std(
                f"{kind} jax_vmap", float(np.std(delta - expected)), clip / batch_size))
    return results


def selfcheck(args, paths):
    results = []
    for path in paths:
        if path == "nonprivate":
            x, y = arrays(args.model, 16, seed=2)
            runner = Runner(make_nonprivate_step(FORWARD[args.model], _common.LEARNING_RATE),
                            init_params(args.model), x, y)
            results.append(_common.check_trains(f"{args.model} nonprivate",
                                                [runner() for _ in range(31)]))
        else:
            results += selfcheck_vmap(args.model)
    _common.finish_selfcheck(results)


def versions():
    import jaxlib  # pylint: disable=import-outside-toplevel
    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
            "jax_backend": jax.default_backend()}


def build_step(args, path):
    """The jitted step of ``path`` on a fixed batch, as a no-argument callable."""
    x, y = arrays(args.model, args.batch_size)
    jitted = make_step(path, args.model, _common.LEARNING_RATE, args.noise_multiplier,
                       _common.L2_NORM_CLIP)
    return Runner(jitted, init_params(args.model), x, y)


def main():
    _common.run(__doc__.splitlines()[0], PATHS, versions=versions, selfcheck=selfcheck,
                build_step=build_step, title="JAX (CPU, jit)")


if __name__ == "__main__":
    main()
