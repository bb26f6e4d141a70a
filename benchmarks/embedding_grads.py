# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""Embedding layer: layer_grads.embedding vs the engine's generic per-example VJP.

One process, both under tf.function, interleaved repeats, medians. Peak memory
above the inputs from TF's CPU allocator statistics (this script turns on the
BFC allocator on CPU, which keeps them, before TensorFlow is imported).

    python benchmarks/embedding_grads.py [--batch 256 --seq 64 --vocab 50000 --dim 64
                                          --microbatches 256 --repeats 5]
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_tempered._compat import keras, tf  # noqa: E402
from tf_tempered.privacy import EngineOptions, layer_grads as handlers, recording  # noqa: E402
from tf_tempered.privacy.layer_grads import clip_weights as clip  # noqa: E402
from tf_tempered.privacy.layer_grads import embedding as emb_grads  # noqa: E402


def _weights(sq):
    norm = tf.sqrt(tf.cast(sq, tf.float32))
    finite = tf.cast(tf.math.is_finite(norm), tf.float32)
    scale = tf.where(finite > 0, 1.0 / tf.maximum(tf.where(finite > 0, norm, 1.0), 1.0), 0.0)
    return clip.ClipWeights(scale, finite)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=50000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--paths", default="nonprivate,layer_grads,generic")
    args = parser.parse_args()
    m = args.microbatches

    layer = keras.layers.Embedding(args.vocab, args.dim)
    layer.build(None)
    ids = tf.random.stateless_uniform([args.batch, args.seq], [1, 2], 0, args.vocab, tf.int32)
    g = tf.random.stateless_normal([args.batch, args.seq, args.dim], [3, 4])

    @tf.function
    def nonprivate(i, gg):  # the ordinary (sparse) gradient of the layer
        with tf.GradientTape() as tape:
            y = layer(i)
        grad = tape.gradient(y, layer.embeddings, output_gradients=gg)
        return grad.values, grad.indices

    @tf.function
    def layer_grads(i, gg):
        sq = emb_grads.embedding_sq_norms(i, gg, m)
        s = emb_grads.embedding_clipped_sum(i, gg, _weights(sq), args.vocab)
        return sq, s.values, s.indices

    @tf.function
    def generic(i, gg):  # the generic per-example VJP fallback, for comparison
        record = recording.LayerRecord(layer, handlers.GENERIC, {}, i, None, (), {}, layer.call)
        record.grad_output = gg
        norms = handlers.GENERIC.layer_result(record, {}, handlers.MicrobatchLayout(m, args.batch // m,
                                                                 EngineOptions()))
        return norms.sq_norms, norms.clipped_sum(_weights(norms.sq_norms))[0]

    fns = {"nonprivate": nonprivate, "layer_grads": layer_grads, "generic": generic}
    paths = args.paths.split(",")
    times = {p: [] for p in paths}
    peaks = {}
    results = {}
    for p in paths:  # trace, warm up, peak memory of one call
        results[p] = fns[p](ids, g)
        del results[p]
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        out = fns[p](ids, g)
        peaks[p] = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
        del out
    for _ in range(args.repeats):
        for p in paths:
            start = time.perf_counter()
            out = fns[p](ids, g)
            _ = [t.numpy() for t in tf.nest.flatten(out)[:1]]
            times[p].append(time.perf_counter() - start)
            del out
    a = layer_grads(ids, g)
    if "generic" in paths:  # the two agree
        b = generic(ids, g)
        dense = tf.convert_to_tensor(tf.IndexedSlices(a[1], a[2], [args.vocab, args.dim]))
        print("max |sq diff| / max sq:", float(tf.reduce_max(tf.abs(a[0] - b[0]))
                                              / tf.reduce_max(b[0])),
              " max |clipped sum diff|:", float(tf.reduce_max(tf.abs(dense - b[1]))))
    report = {p: {"median_ms": 1000 * statistics.median(times[p]),
                  "times_ms": [round(1000 * t, 1) for t in times[p]],
                  "peak_MB": round(peaks[p] / 1e6, 1)} for p in paths}
    print(json.dumps({"args": vars(args), "results": report}, indent=1))


if __name__ == "__main__":
    main()
