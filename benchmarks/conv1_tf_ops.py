"""The MNIST CNN's conv1 per-example kernel gradients in TF ops: which formulation is fastest.

    python benchmarks/conv1_tf_ops.py [--rounds=3] [--json=FILE]

The TF-ops path (what a GPU runs; `TF_TEMPERED_NATIVE=0` on CPU) must form conv1's
per-example gradients, 8×8 stride-2 "same" on [256, 28, 28, 1] into 16 channels, from the
layer's input and output gradient. Each formulation below returns every example's squared
gradient norm (so each is checked against the engine's own), traced once by tf.function and
timed over 30 calls per round, the rounds alternating:

* depthwise: the engine's path where TF runs oneDNN's kernels (conv_grads.per_example_kernel_grads:
  depthwise-conv backprop with the batch folded into channels, chunks of 128 examples);
* gather: image patches by one tf.gather of whole pixels (conv_grads.patches), then a batched
  matmul with the output gradient;
* two_gathers: row frames, then column frames (each gather moves runs of pixels), a transpose and
  the batched matmul;
* slices: the 64 kernel offsets as strided slices, concatenated;
* space_to_depth: 8×8 stride 2 as 4×4 stride 1 on space_to_depth(2) of the padded image, 16 slices;
* extract_patches: tf.image.extract_patches of the padded image, then the batched matmul;
* identity_conv: the patches as the output of a Conv2D whose kernel is the 64×64 identity
  (oneDNN's convolution moving the pixels), then the batched matmul;
* depthwise_forward: the batch folded into channels as the *forward* depthwise conv of the
  padded image [1, 34, 34, B] with g as its filter [14, 14, B, 16], dilation 2;
* grouped_backprop: the batch folded into channels as a grouped convolution of B groups, its
  filter gradient (TF's Conv2DBackpropFilter of [1, 34, 34, B] against [1, 14, 14, B·16]: the
  per-example gradients, as oneDNN's grouped kernel rather than its depthwise one);
* grouped_phases (with --jit_compile only; not timed on TF's executor): the 4 stride phases of
  the padded image as a batch, convolved with g as a filter of B groups;
* depthwise_multiplier_1: the depthwise backprop with (example, filter) pairs folded into
  channels and a channel multiplier of 1 (the image repeated for each filter);
* product_of_given_patches (for scale, not a formulation): the batched product of the patch
  formulations alone, the patches made once outside the timed call: a floor for all of them;
* nonprivate_filter_gradient (for scale): the non-private step's work for this layer, the batch's
  summed filter gradient (TF's Conv2DBackpropFilter).

With --jit_compile every formulation (and the non-private filter gradient) is compiled by
XLA, what a GPU user's jit_compile=True step runs; the depthwise backprop is then XLA's
grouped convolution, not oneDNN's kernel, and the offsets formulation
(conv_grads.per_example_kernel_grads_by_offsets, the engine's XLA path) is added.

Used for docs/benchmarks.md's TF-ops paragraph (issue 30, item 5): the non-private step's own
conv1 filter gradient (the last row) is several times cheaper than the fastest of them.
"""

import argparse
import json
import pathlib
import platform
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from tf_tempered import keras_bridge  # noqa: E402
from tf_tempered._compat import keras, tf  # noqa: E402
from tf_tempered.privacy.layer_grads import conv_grads  # noqa: E402

BATCH, SIZE, OUT, KERNEL, STRIDE, FILTERS = 256, 28, 14, 8, 2, 16
PAD = ((OUT - 1) * STRIDE + KERNEL - SIZE) // 2  # "same": 3 before, 3 after


def _layer():
    layer = keras.layers.Conv2D(FILTERS, KERNEL, strides=STRIDE, padding="same")
    layer.build((None, SIZE, SIZE, 1))
    return layer


def _norms_from_patches(patches, g):
    """‖P_bᵀ G_b‖² per example from patches [B, rows, 64] and g [B, 14, 14, 16]."""
    grads = tf.matmul(patches, tf.reshape(g, [BATCH, OUT * OUT, FILTERS]), transpose_a=True)
    return tf.reduce_sum(tf.square(grads), [1, 2])


def _padded(x):
    return tf.pad(x, [[0, 0], [PAD, PAD], [PAD, PAD], [0, 0]])


def formulations(layer, jit_compile=False):
    starts = np.arange(OUT) * STRIDE
    frames = (starts[:, None] + np.arange(KERNEL)[None]).reshape(-1)
    side = SIZE + 2 * PAD

    def depthwise(x, g):
        per_example = conv_grads.per_example_kernel_grads(layer, x, g)  # [64, B, 16]
        return tf.reduce_sum(tf.square(per_example), [0, 2])

    def gather(x, g):
        return _norms_from_patches(conv_grads.patches(layer, x), g)

    def two_gathers(x, g):
        columns = tf.reshape(tf.gather(_padded(x)[..., 0], frames, axis=2),
                             [BATCH, side, OUT * KERNEL])
        rows = tf.reshape(tf.gather(columns, frames, axis=1), [BATCH, OUT, KERNEL, OUT, KERNEL])
        patches = tf.reshape(tf.transpose(rows, [0, 1, 3, 2, 4]), [BATCH, OUT * OUT, -1])
        return _norms_from_patches(patches, g)

    def slices(x, g):
        xp, end = _padded(x), (OUT - 1) * STRIDE + 1
        parts = [xp[:, a:a + end:STRIDE, b:b + end:STRIDE, :]
                 for a in range(KERNEL) for b in range(KERNEL)]
        return _norms_from_patches(tf.reshape(tf.concat(parts, -1), [BATCH, OUT * OUT, -1]), g)

    def space_to_depth(x, g):
        blocks, k = tf.nn.space_to_depth(_padded(x), STRIDE), KERNEL // STRIDE
        parts = [blocks[:, a:a + OUT, b:b + OUT, :] for a in range(k) for b in range(k)]
        return _norms_from_patches(tf.reshape(tf.stack(parts, 3), [BATCH, OUT * OUT, -1]), g)

    def extract_patches(x, g):
        patches = tf.image.extract_patches(_padded(x), [1, KERNEL, KERNEL, 1],
                                           [1, STRIDE, STRIDE, 1], [1, 1, 1, 1], "VALID")
        return _norms_from_patches(tf.reshape(patches, [BATCH, OUT * OUT, -1]), g)

    identity = tf.reshape(tf.eye(KERNEL * KERNEL), [KERNEL, KERNEL, 1, KERNEL * KERNEL])

    def identity_conv(x, g):
        patches = tf.nn.conv2d(x, identity, [1, STRIDE, STRIDE, 1], "SAME")
        return _norms_from_patches(tf.reshape(patches, [BATCH, OUT * OUT, -1]), g)

    def depthwise_forward(x, g):
        folded = tf.transpose(_padded(x)[..., 0], [1, 2, 0])[None]  # [1, 34, 34, B]
        grads = tf.nn.depthwise_conv2d(folded, tf.transpose(g, [1, 2, 0, 3]), [1, 1, 1, 1],
                                       "VALID", dilations=[STRIDE, STRIDE])  # [1, 8, 8, B·16]
        return tf.reduce_sum(tf.square(tf.reshape(grads, [-1, BATCH, FILTERS])), [0, 2])

    def grouped_backprop(x, g):
        folded = tf.transpose(_padded(x)[..., 0], [1, 2, 0])[None]  # [1, 34, 34, B]
        g_folded = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, OUT, OUT, BATCH * FILTERS])
        grads = tf.raw_ops.Conv2DBackpropFilter(
            input=folded, filter_sizes=[KERNEL, KERNEL, 1, BATCH * FILTERS], out_backprop=g_folded,
            strides=[1, STRIDE, STRIDE, 1], padding="VALID")  # [8, 8, 1, B·16]
        return tf.reduce_sum(tf.square(tf.reshape(grads, [-1, BATCH, FILTERS])), [0, 2])

    def depthwise_multiplier_1(x, g):
        # (example, filter) pairs folded into channels, the image repeated for each filter.
        folded = tf.transpose(x[..., 0], [1, 2, 0])[None, :, :, :, None]  # [1, 28, 28, B, 1]
        folded = tf.reshape(tf.broadcast_to(folded, [1, SIZE, SIZE, BATCH, FILTERS]),
                            [1, SIZE, SIZE, BATCH * FILTERS])
        g_folded = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [1, OUT, OUT, BATCH * FILTERS])
        grads = tf.compat.v1.nn.depthwise_conv2d_native_backprop_filter(
            folded, [KERNEL, KERNEL, BATCH * FILTERS, 1], g_folded, [1, STRIDE, STRIDE, 1],
            "SAME")  # [8, 8, B·16, 1]
        return tf.reduce_sum(tf.square(tf.reshape(grads, [-1, BATCH, FILTERS])), [0, 2])

    def grouped_phases(x, g):
        phases = tf.transpose(tf.nn.space_to_depth(_padded(x), STRIDE), [3, 1, 2, 0])
        kernel = tf.reshape(tf.transpose(g, [1, 2, 0, 3]), [OUT, OUT, 1, BATCH * FILTERS])
        grads = tf.nn.conv2d(phases, kernel, [1, 1, 1, 1], "VALID")  # [4, 4, 4, B·16]
        return tf.reduce_sum(tf.square(tf.reshape(grads, [-1, BATCH, FILTERS])), [0, 2])

    def offsets(x, g):
        per_example = conv_grads.per_example_kernel_grads_by_offsets(layer, x, g)
        return tf.reduce_sum(tf.square(tf.reshape(per_example, [-1, BATCH, FILTERS])), [0, 2])

    fns = [("depthwise", depthwise), ("gather", gather), ("two_gathers", two_gathers),
           ("slices", slices), ("space_to_depth", space_to_depth),
           ("extract_patches", extract_patches), ("identity_conv", identity_conv),
           ("depthwise_forward", depthwise_forward), ("grouped_backprop", grouped_backprop),
           ("depthwise_multiplier_1", depthwise_multiplier_1)]
    if jit_compile:
        fns += [("grouped_phases", grouped_phases), ("offsets", offsets)]
    return {name: tf.function(fn, jit_compile=jit_compile) for name, fn in fns}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--jit_compile", action="store_true",
                        help="compile every formulation with XLA")
    parser.add_argument("--json")
    args = parser.parse_args()
    x = tf.random.normal([BATCH, SIZE, SIZE, 1], seed=1)
    g = tf.random.normal([BATCH, OUT, OUT, FILTERS], seed=2)
    fns = formulations(_layer(), args.jit_compile)
    reference = formulations(_layer())["depthwise"](x, g).numpy()  # TF's executor, oneDNN
    for name, fn in fns.items():
        error = float(np.max(np.abs(fn(x, g).numpy() - reference) / reference))
        if error > 1e-4:
            raise SystemExit(f"{name} disagrees with the engine's norms: relative error {error}")
    # The non-private step's own work for this layer: the batch's summed filter gradient.
    fns["nonprivate_filter_gradient"] = tf.function(
        lambda x, g: tf.compat.v1.nn.conv2d_backprop_filter(
            x, [KERNEL, KERNEL, 1, FILTERS], g, strides=[1, STRIDE, STRIDE, 1], padding="SAME"),
        jit_compile=args.jit_compile)
    # A floor for every patch formulation: their batched product alone, the patches given
    # (made once, outside the timed call, in the layout the product reads fastest).
    given = tf.transpose(tf.reshape(tf.nn.conv2d(x, tf.reshape(
        tf.eye(KERNEL * KERNEL), [KERNEL, KERNEL, 1, -1]), [1, STRIDE, STRIDE, 1], "SAME"),
        [BATCH, OUT * OUT, -1]), [0, 2, 1])  # [B, 64, 196]
    fns["product_of_given_patches"] = tf.function(
        lambda x, g: tf.reduce_sum(tf.square(tf.matmul(
            given, tf.reshape(g, [BATCH, OUT * OUT, FILTERS]))), [1, 2]),
        jit_compile=args.jit_compile)
    times = {name: [] for name in fns}
    for _ in range(args.rounds):
        for name, fn in fns.items():
            for _ in range(3):
                fn(x, g)
            start = time.perf_counter()
            for _ in range(args.calls):
                fn(x, g)
            times[name].append((time.perf_counter() - start) / args.calls * 1000)
    print(f"conv1 of the MNIST CNN, batch {BATCH}, TF {tf.__version__}, {platform.machine()}, "
          f"oneDNN kernels: {keras_bridge.onednn_enabled()}, XLA: {args.jit_compile}")
    print("| formulation | ms per call (median of rounds) | rounds |")
    print("|---|---:|---|")
    for name, values in times.items():
        print(f"| {name} | {np.median(values):.2f} | {', '.join(f'{v:.2f}' for v in values)} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(times, indent=1))


if __name__ == "__main__":
    main()
