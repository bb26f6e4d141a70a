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
"""How much of the DP step is the noise draw: the step with the draw, and with zeros instead.

    python benchmarks/noise_share.py --model=text --rounds=5

One process builds three models of `dp_step.py`'s --model: the non-private step, the DP step
(make_private's defaults), and the same DP step with `randomness.gaussian_noise_like`
replaced by zeros while it is traced. That third step is NOT private: it exists only to
measure the draw's share (N(0, σ²C²) on every trainable coordinate, however few rows of an
embedding a batch touches). Rounds interleave the three; the table gives median ms/step and
the peak of TF's CPU allocator, each against the non-private step. Every model stays alive,
so the peaks include the others' weights: compare within a run.
"""

import os
import sys

os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # the peak-memory statistics
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import dp_step  # noqa: E402
from tf_tempered._compat import keras, tf  # noqa: E402
from tf_tempered.privacy import DPKerasSGDOptimizer, make_private, randomness  # noqa: E402


def _dp_model(kind, zero_noise):
    draw = randomness.gaussian_noise_like
    if zero_noise:  # only while this model's step is traced (its first fit below)
        randomness.gaussian_noise_like = lambda variables, *a, **k: [
            tf.zeros(v.shape, v.dtype) for v in variables]
    model = dp_step._model(kind)  # pylint: disable=protected-access
    make_private(model)
    model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                      learning_rate=0.15),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    return model, draw


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="text", choices=("mnist", "cifar10", "text", "lstm",
                                                            "gru", "lora", "conv1d"))
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # fit's accounting warning on a plain tf.data pipeline
    data = dp_step._dataset(args.model, args.batch_size)  # pylint: disable=protected-access
    models = {"nonprivate": dp_step._compiled("nonprivate", args.model, args.batch_size)}  # pylint: disable=protected-access
    models["nonprivate"].fit(data, steps_per_epoch=2, epochs=1, verbose=0)
    for name, zero in (("dp", False), ("dp_zero_noise_NOT_PRIVATE", True)):
        model, draw = _dp_model(args.model, zero)
        model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)  # traced here
        randomness.gaussian_noise_like = draw
        models[name] = model
    times, peaks = {k: [] for k in models}, {k: 0 for k in models}
    for _ in range(args.rounds):
        for name, model in models.items():
            tf.config.experimental.reset_memory_stats("CPU:0")
            start = time.perf_counter()
            model.fit(data, steps_per_epoch=args.steps, epochs=1, verbose=0)
            times[name].append((time.perf_counter() - start) / args.steps * 1000)
            peaks[name] = max(peaks[name],
                              tf.config.experimental.get_memory_info("CPU:0")["peak"])
    base, base_peak = statistics.median(times["nonprivate"]), peaks["nonprivate"]
    print(f"\n{args.model}, batch {args.batch_size}, {args.rounds} rounds of {args.steps} steps")
    print("| step | ms/step | × non-private | peak MiB | × non-private |\n|---|---:|---:|---:|---:|")
    for name in models:
        ms = statistics.median(times[name])
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} | {peaks[name] / 2**20:.0f} | "
              f"{peaks[name] / base_peak:.2f} |")


if __name__ == "__main__":
    main()
