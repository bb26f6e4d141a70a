"""‖G_m‖² of per-example kernel gradients [64 offsets, 256 examples, 16] (the MNIST CNN's conv1 by
the depthwise backprop), five ways, each a tf.function; µs a call including the call itself
(the `noop` row), median of 15 rounds of 50 calls.

    python reduce_forms.py
"""
import time

import numpy as np
import tensorflow as tf

m = tf.random.normal([64, 256, 16])
ways = {
    "noop": lambda m: m[0, 0, 0],
    "axes [0, 2] at once (old)": lambda m: tf.reduce_sum(tf.square(m), [0, 2]),
    "axis 0, then 1 (new)": lambda m: tf.reduce_sum(tf.reduce_sum(tf.square(m), 0), 1),
    "axis 2, then 0": lambda m: tf.reduce_sum(tf.reduce_sum(tf.square(m), 2), 0),
    "einsum kbo,kbo->b": lambda m: tf.einsum("kbo,kbo->b", m, m),
    "transpose, then axis 1": lambda m: tf.reduce_sum(tf.square(tf.reshape(
        tf.transpose(m, [1, 0, 2]), [256, -1])), 1),
}
ways = {k: tf.function(f) for k, f in ways.items()}
reference = ways["axes [0, 2] at once (old)"](m).numpy()
for name, f in ways.items():
    for _ in range(20):
        f(m)
    if name != "noop":
        assert np.allclose(f(m).numpy(), reference, rtol=1e-5), name
times = {k: [] for k in ways}
for _ in range(15):
    for name, f in ways.items():
        start = time.perf_counter()
        for _ in range(50):
            f(m)
        times[name].append((time.perf_counter() - start) / 50 * 1e6)
print(f"TF {tf.__version__}\n\n| way | µs a call | less the call |\n|---|---:|---:|")
noop = np.median(times["noop"])
for name, v in times.items():
    print(f"| {name} | {np.median(v):.0f} | {np.median(v) - noop:.0f} |")
