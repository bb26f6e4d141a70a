# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""A Conv2D's per-example kernel gradients and their squared norms, five ways, with and without XLA.

For the MNIST and CIFAR-10 CNNs' convolutions at batch 256 (random inputs and output
gradients of the layer's shapes): image patches (one gather) and a batched matmul; one
product per kernel offset (`conv_grads.per_example_kernel_grads_by_offsets`, what an XLA step
takes where gradients are kept); one product per block of stride×stride offsets
(`conv_grads.per_example_kernel_grads_by_blocks`, what a strided layer's kept gradients take
where TF's kernels are not oneDNN's); the depthwise backprop of the batch folded into channels;
and, for scale, the ghost norm from patches and the batch's filter gradient (what the
non-private step computes). Each under tf.function, with jit_compile False and True; the
best of --rounds rounds of --calls calls, in ms. Every way's norms are checked against the
patches way's. The depthwise backprop under XLA takes seconds a call: --depthwise_xla to time it.

    python benchmarks/conv_kernel_grads.py [--layers mnist_conv1,cifar_conv1] [--rounds 3]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tf_tempered._compat import keras, tf  # noqa: E402
from tf_tempered.privacy.layer_grads import conv_grads  # noqa: E402

BATCH = 256
# name: (filters, kernel, strides, padding, input [H, W, C]), as in tf_tempered.models.
LAYERS = {
    "mnist_conv1": (16, 8, 2, "same", (28, 28, 1)),
    "mnist_conv2": (32, 4, 2, "valid", (13, 13, 16)),
    "cifar_conv1": (32, 3, 1, "same", (32, 32, 3)),
    "cifar_conv2": (32, 3, 1, "same", (32, 32, 32)),
    "cifar_conv3": (64, 3, 1, "same", (16, 16, 32)),
    "cifar_conv5": (128, 3, 1, "same", (8, 8, 64)),
}


def _ways(layer, g):
    """name -> fn(x, g) of [B] squared norms (the filter gradient: the batch's gradient)."""
    g_rows = tf.reshape(g, [g.shape[0], -1, g.shape[-1]])

    def patches(x, g):
        per_example = tf.einsum("bpk,bpo->bko", conv_grads.patches(layer, x), g_rows)
        return tf.reduce_sum(tf.square(per_example), [1, 2])

    def offsets(x, g):
        per_example = conv_grads.per_example_kernel_grads_by_offsets(layer, x, g)
        return tf.reduce_sum(tf.square(per_example), [0, 2])

    def blocks(x, g):
        per_example = conv_grads.per_example_kernel_grads_by_blocks(layer, x, g)
        return tf.reduce_sum(tf.square(per_example), [0, 2])

    def depthwise(x, g):
        per_example = conv_grads.per_example_kernel_grads(layer, x, g)
        return tf.reduce_sum(tf.square(per_example), [0, 2])

    def ghost(x, g):
        rows = conv_grads.patches(layer, x)
        return tf.reduce_sum(tf.matmul(rows, rows, transpose_b=True)
                             * tf.matmul(g_rows, g_rows, transpose_b=True), [1, 2])

    def filter_gradient(x, g):
        return tf.compat.v1.nn.conv2d_backprop_filter(
            x, list(layer.kernel.shape), g, [1, *layer.strides, 1], layer.padding.upper())

    return {"patches": patches, "offsets": offsets, "blocks": blocks, "depthwise": depthwise,
            "ghost": ghost, "filter_gradient": filter_gradient}


def _best_ms(fn, x, g, rounds, calls):
    fn(x, g).numpy()  # traced (and compiled) first
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn(x, g).numpy()
        best = min(best, (time.perf_counter() - start) / calls * 1e3)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default=",".join(LAYERS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--depthwise_xla", action="store_true")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| layer | way | ms, TF executor | ms, XLA |\n|---|---|---:|---:|")
    for name in args.layers.split(","):
        filters, kernel, strides, padding, shape = LAYERS[name]
        layer = keras.layers.Conv2D(filters, kernel, strides=strides, padding=padding)
        x = tf.constant(rng.normal(size=(BATCH, *shape)), tf.float32)
        g = tf.constant(rng.normal(size=layer.compute_output_shape((BATCH, *shape))), tf.float32)
        layer.build((None, *shape))
        reference = None
        for way, fn in _ways(layer, g).items():
            cells = []
            for jit in (False, True):
                if way == "depthwise" and jit and not args.depthwise_xla:
                    cells.append("(--depthwise_xla)")
                    continue
                compiled = tf.function(fn, jit_compile=jit)
                if way != "filter_gradient":
                    norms = compiled(x, g).numpy()
                    reference = norms if reference is None else reference
                    np.testing.assert_allclose(norms, reference, rtol=2e-3)
                cells.append(f"{_best_ms(compiled, x, g, args.rounds, args.calls):.2f}")
            print(f"| {name} | {way} | {cells[0]} | {cells[1]} |", flush=True)


if __name__ == "__main__":
    main()
