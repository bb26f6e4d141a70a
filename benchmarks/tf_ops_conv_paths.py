# Copyright 2026 The tf_tempered Authors. Licensed under the Apache License, Version 2.0.
"""The MNIST CNN's TF-ops DP step (what a GPU runs) with its Conv2D paths chosen by hand.

    python benchmarks/tf_ops_conv_paths.py [--variants=tf_ops,conv2_materialized,...]
        [--rounds=7] [--steps=20]

One process, batch 256, Keras' fit on one in-memory batch (dp_step.py's model and data);
rounds alternate the non-private step and every variant, each a median ms a step and its
ratio to the non-private step. Variants (EngineOptions(native=False) unless said):

* tf_ops: the engine's own choice (conv1: the depthwise backprop; conv2: a ghost norm from
  patches, its clipped sum by TF's backprop-filter op);
* depthwise_chunk_64 / depthwise_chunk_256: conv1's depthwise backprop in chunks of 64 or
  256 examples (EngineOptions.depthwise_chunk; default 128);
* conv2_materialized_by_patches / _by_offsets / _by_blocks: conv2's per-example gradients kept
  (formed from patches, one product per kernel offset, or per block of offsets) and summed
  by a matrix-vector product instead of the ghost norm and backprop-filter op;
* conv2_depthwise: conv2 by the depthwise backprop too (512 channel pairs);
* native: the native op (for scale; CPU only).

conv2's path is forced by replacing `conv.choose_path` while the step is traced (the engine
has no per-layer option); the variants' updates are the same DP update (tests/test_engine.py
and the conformance tests check each path).
"""

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import dp_step  # noqa: E402
from tf_tempered._compat import keras  # noqa: E402
from tf_tempered.privacy import (DPKerasSGDOptimizer, EngineOptions, layer_paths,  # noqa: E402
                                 make_private)
from tf_tempered.privacy.layer_grads import conv  # noqa: E402

_CHOOSE = conv.choose_path
_CONV2 = {"conv2_materialized_by_patches": conv.ConvPath(False, False, True, "patches"),
          "conv2_materialized_by_offsets": conv.ConvPath(False, False, True, "offsets"),
          "conv2_materialized_by_blocks": conv.ConvPath(False, False, True, "blocks"),
          "conv2_depthwise": conv.ConvPath(False, True, True)}
OPTIONS = {"tf_ops": dict(native=False),
           "depthwise_chunk_64": dict(native=False, depthwise_chunk=64),
           "depthwise_chunk_256": dict(native=False, depthwise_chunk=256),
           **{name: dict(native=False) for name in _CONV2}, "native": {}}


def _conv2_as(path):
    def choose(src, hparams, *args, **kwargs):
        if hparams.kernel_size == (4, 4):  # the MNIST CNN's conv2
            return path
        return _CHOOSE(src, hparams, *args, **kwargs)
    return choose


def _model(variant, data):
    model = dp_step._model("mnist")  # pylint: disable=protected-access
    if variant == "nonprivate":
        model.compile(keras.optimizers.SGD(0.15),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return model
    make_private(model, options=EngineOptions(**OPTIONS[variant]))
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.15),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    conv.choose_path = _conv2_as(_CONV2[variant]) if variant in _CONV2 else _CHOOSE
    try:
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # traced with that choice
    finally:
        conv.choose_path = _CHOOSE
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(OPTIONS))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in OPTIONS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}; "
                         f"choose from {', '.join(OPTIONS)}")
    data = dp_step._dataset("mnist", 256)  # pylint: disable=protected-access
    models = {v: _model(v, data) for v in ["nonprivate"] + variants}
    for model in models.values():
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)
    times = {v: [] for v in models}
    for _ in range(args.rounds):
        for v, model in models.items():
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0)
            times[v].append((time.perf_counter() - start) / args.steps * 1000)
    base = statistics.median(times["nonprivate"])
    print(f"MNIST CNN, batch 256, Keras {keras.__version__}, {args.rounds} rounds of "
          f"{args.steps} steps\n")
    print("| variant | ms/step | × non-private | rounds | conv1 path | conv2 path |\n"
          "|---|---:|---:|---|---|---|")
    for v, values in times.items():
        paths = ({p["layer"]: p["path"] for p in layer_paths(models[v])}
                 if v != "nonprivate" else {})
        print(f"| {v} | {statistics.median(values):.2f} | {statistics.median(values) / base:.2f} | "
              f"{' '.join(f'{t:.1f}' for t in values)} | {paths.get('conv1', '')} | "
              f"{paths.get('conv2', '')} |")


if __name__ == "__main__":
    main()
