"""Interleaved in-process timing of traced training steps (for A/B scripts in benchmarks/results/).

Each variant's step is already a traced function; rounds of ``calls`` calls alternate between
the variants, so load that drifts over a run hits all alike. The report gives each variant's
median ms a step against the first variant and, for each pair, the median per-round ratio.
"""
import time

import numpy as np


def time_rounds(steps, data, rounds, calls=10):
    """{name: [ms a step per round]} for steps {name: traced step(data)}."""
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(calls):
                step(data)
            times[name].append((time.perf_counter() - start) / calls * 1000)
    return times


def report(times):
    """Prints the medians (× the first variant) and per-round ratios of each pair."""
    names = list(times)
    base = np.median(times[names[0]])
    for name, values in times.items():
        print(f"{name:12s} median {np.median(values):.2f} ms  x{np.median(values) / base:.3f} of "
              f"{names[0]} (q25 {np.percentile(values, 25):.2f} q75 {np.percentile(values, 75):.2f})")
    for a in names[1:]:
        for b in names[1:]:
            if a < b:
                ratio = np.median(np.array(times[b]) / np.array(times[a]))
                print(f"{b}/{a} per-round median {ratio:.3f}")


def mnist_dp_model(options=None):
    """dp_step.py's MNIST CNN, made private with EngineOptions ``options`` and compiled as its
    tf_tempered path is (C = 1, σ = 1.1, per-example losses)."""
    import dp_step  # pylint: disable=g-import-not-at-top
    from tf_tempered._compat import keras  # pylint: disable=g-import-not-at-top
    from tf_tempered.privacy import DPKerasSGDOptimizer, make_private  # pylint: disable=g-import-not-at-top
    model = dp_step._model("mnist")  # pylint: disable=protected-access
    make_private(model, options=options)
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=0.15),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    return model
