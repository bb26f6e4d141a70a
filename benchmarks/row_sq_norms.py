# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Squared row norms of materialized per-microbatch gradients: the native op vs TF's ops.

tf.reduce_sum(tf.square(x), 1) against native.row_sq_norms(x) (cc/row_sq_norms.cc), each
under tf.function, interleaved rounds of 100 calls, medians in ms (the call overhead
included). Shapes: the text classifier's materialized Dense/EinsumDense gradients
([256, 8192], [256, 4096]), the GRU's recurrent kernel's ([256, 12288]), a small one.

    python benchmarks/row_sq_norms.py [--rounds 2]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from tf_tempered._compat import tf  # noqa: E402
from tf_tempered.privacy import native  # noqa: E402

SHAPES = [(256, 8192), (256, 4096), (256, 12288), (256, 864)]


def _median_ms(fn, x, calls=100):
    for _ in range(5):
        fn(x)
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn(x).numpy()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if not native.usable():
        raise SystemExit("the native library is not available here (no compiler or a GPU)")
    fns = {"tf square+sum": tf.function(lambda x: tf.reduce_sum(tf.square(x), 1)),
           "native": tf.function(native.row_sq_norms)}
    print("| shape | round | " + " | ".join(f"{name} ms" for name in fns) + " |")
    print("|---|---:|" + "---:|" * len(fns))
    for shape in SHAPES:
        x = tf.constant(np.random.default_rng(0).standard_normal(shape), tf.float32)
        want = (x.numpy().astype(np.float64) ** 2).sum(1)
        for fn in fns.values():
            np.testing.assert_allclose(fn(x).numpy(), want, rtol=1e-5)
        for r in range(args.rounds):
            times = [_median_ms(fn, x) for fn in fns.values()]
            print(f"| {list(shape)} | {r + 1} | " + " | ".join(f"{t:.3f}" for t in times) + " |")


if __name__ == "__main__":
    main()
