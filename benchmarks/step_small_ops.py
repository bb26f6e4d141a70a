# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Kernel time of two small ops of the DP step, each done two ways, from TF's profiler.

The MNIST CNN's Conv2D output gradients at batch 256 ([256, 14, 14, 16] and [256, 5, 5, 32]):
  * scaling each example by its clip factor (a Conv2D's book-keeping sum), as a [B, 1, 1, 1]
    broadcast against the 4-D tensor (what conv.py does) and as a [B, 1] one against its
    [B, -1] view;
  * a bias's clipped sum, by summing the rescaled c·g over all rows ([B·P, C] → [C]), and as
    one [B]·[B, C] product of the per-example bias gradients the norms computed anyway (what
    rows.linear_norms does since it was measured here: benchmarks/results/step_small_ops.md).
Each way is a tf.function called --calls times under the profiler; the time is the mean of
its ops' kernel events (the executor's own time and the call's Python overhead excluded).

    python benchmarks/step_small_ops.py [--calls 200]
"""

import argparse
import collections
import glob
import os
import tempfile

import numpy as np
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2


def _ways(rng):
    """[(name, tf.function, args)] of every way on both shapes."""
    ways = []
    for shape in ([256, 14, 14, 16], [256, 5, 5, 32]):
        g = tf.constant(rng.normal(size=shape), tf.float32)
        c = tf.constant(rng.random(shape[0]), tf.float32)
        per_example_bias = tf.reduce_sum(g, [1, 2])
        ways += [
            (f"scale, [B, 1, 1, 1] broadcast {shape}",
             tf.function(lambda g, c: g * tf.reshape(c, [-1, 1, 1, 1])), (g, c)),
            (f"scale, [B, -1] view {shape}",
             tf.function(lambda g, c: tf.reshape(tf.reshape(g, [g.shape[0], -1]) * c[:, None],
                                                 g.shape)), (g, c)),
            (f"bias sum, over all rows of c·g {shape}",
             tf.function(lambda g: tf.reduce_sum(tf.reshape(g, [-1, g.shape[-1]]), 0)), (g,)),
            (f"bias sum, [B]·[B, C] {shape}",
             tf.function(lambda b, c: tf.linalg.matvec(b, c, transpose_a=True)),
             (per_example_bias, c)),
        ]
    return ways


def _kernel_us(logdir, ways, calls):
    """{name: mean kernel µs a call} from the profile's op events inside each way's trace."""
    space = xplane_pb2.XSpace()
    with open(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True)[0], "rb") as f:
        space.ParseFromString(f.read())
    names = {name for name, _, _ in ways}
    spans, ops = [], []
    for plane in space.planes:
        if "host:CPU" not in plane.name:
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                start = line.timestamp_ns * 1000 + event.offset_ps
                if name in names:
                    spans.append((start, start + event.duration_ps, name))
                elif (line.name.startswith("tf_Compute") and not name.startswith("Executor")
                      and name != "ParallelFor"):
                    ops.append((start, event.duration_ps))
    total = collections.Counter()
    for start, duration in ops:
        for begin, end, name in spans:
            if begin <= start <= end:
                total[name] += duration / 1e6 / calls
    return total


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    ways = _ways(np.random.default_rng(0))
    for _, fn, fn_args in ways:  # traced first
        for _ in range(5):
            fn(*fn_args)
    logdir = tempfile.mkdtemp()
    tf.profiler.experimental.start(logdir)
    for name, fn, fn_args in ways:
        with tf.profiler.experimental.Trace(name):
            for _ in range(args.calls):
                fn(*fn_args)
    tf.profiler.experimental.stop()
    total = _kernel_us(logdir, ways, args.calls)
    print(f"TF {tf.__version__}, oneDNN {'on' if os.environ.get('TF_ENABLE_ONEDNN_OPTS', '') != '0' else 'off'}"
          f" (TF's default on this CPU unless TF_ENABLE_ONEDNN_OPTS is set)\n")
    print("| way | kernel µs a call |\n|---|---:|")
    for name, _, _ in ways:
        print(f"| {name} | {total[name]:.1f} |")


if __name__ == "__main__":
    main()
