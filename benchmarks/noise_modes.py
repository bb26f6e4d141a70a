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
"""The noise samplers side by side (EngineOptions(noise=...)): the draw alone, and one DP step.

Each sampler runs twice: by the native Box–Muller op (privacy/native/cc/box_muller.cc, the
default on CPU) and by TF's ops ("(TF ops)": what XLA, a GPU, or EngineOptions(native=False)
runs). Part 1 draws the noise of a model of P parameters (one traced gaussian_noise_like call
at a fresh counter, as the DP step does); part 2 times `fit` steps of a model made
private with each sampler (benchmarks/dp_step.py's models and synthetic batch). Rounds
interleave the samplers so that the load of the (shared) machine hits them alike; the
tables give median wall-clock and CPU (all threads) ms, their ratio to the default
"gaussian", and the peak of TF's CPU allocator.

    python benchmarks/noise_modes.py                        # 1M and 3.2M values; MNIST CNN
    python benchmarks/noise_modes.py --model=cifar10 --params=605226
    python benchmarks/noise_modes.py --keras=2
"""

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # dp_step, run as a program

if __name__ == "__main__":  # before TensorFlow is imported (importing dp_step imports it)
    for _arg in sys.argv[1:]:  # --keras=2|3, as dp_step.select_keras (which checks the value)
        if _arg == "--keras=2":
            os.environ["TF_USE_LEGACY_KERAS"] = "1"
        elif _arg == "--keras=3":
            os.environ.pop("TF_USE_LEGACY_KERAS", None)
    os.environ.setdefault("TF_CPU_ALLOCATOR_USE_BFC", "true")  # the peak memory column

# pylint: disable=wrong-import-position,import-error
import argparse
import json
import statistics
import time
import warnings

import dp_step
from tf_tempered._compat import keras, tf
from tf_tempered.privacy import DPKerasSGDOptimizer, EngineOptions, make_private, randomness
from tf_tempered.privacy import native
from tf_tempered.privacy.options import NOISE_MODES
from tf_tempered.privacy.step import noise as noise_stage

TF_OPS = " (TF ops)"


def _variants(modes, with_native):
    """[(label, mode, native?)]: each mode by the native op (if built) and by TF's ops."""
    out = []
    for mode in modes:
        if with_native:
            out.append((mode, mode, True))
        out.append((mode + TF_OPS if with_native else mode, mode, False))
    return out


def _peak():
    try:
        return tf.config.experimental.get_memory_info("CPU:0")["peak"]
    except ValueError:  # not the BFC allocator: no statistics
        return 0


def interleaved(runs, rounds, repeats):
    """{name: (median ms, median CPU ms, peak bytes)} of ``repeats`` calls of each run per round."""
    wall, cpu, peak = ({name: [] for name in runs} for _ in range(3))
    for name, run in runs.items():  # trace and warm up outside the timed rounds
        run(1)
    for _ in range(rounds):
        for name, run in runs.items():
            try:
                tf.config.experimental.reset_memory_stats("CPU:0")
            except ValueError:
                pass
            start, cpu_start = time.perf_counter(), time.process_time()
            run(repeats)
            wall[name].append((time.perf_counter() - start) / repeats * 1000)
            cpu[name].append((time.process_time() - cpu_start) / repeats * 1000)
            peak[name].append(_peak())
    return {name: (statistics.median(wall[name]), statistics.median(cpu[name]), max(peak[name]))
            for name in runs}


def draw_runs(size, modes=NOISE_MODES, with_native=True):
    """{label: run(repeats)}: ``repeats`` noise draws for one variable of ``size`` values."""
    variable = tf.Variable(tf.zeros([size]), trainable=False)
    source = randomness.DPRandomness("noise")

    def make(mode, use_native):
        @tf.function
        def draw():  # the engine's draw: by the native ops when usable, else TF's
            (noise,) = randomness.gaussian_noise_like([variable], 1.1, source,
                                                      source.next_counter(), mode=mode,
                                                      native=use_native)
            return noise

        def run(repeats):
            for _ in range(repeats):
                draw()
        return run

    return {label: make(mode, use) for label, mode, use in _variants(modes, with_native)}


def step_runs(kind, batch_size, modes=NOISE_MODES, with_native=True):
    """{label: run(steps)}: ``steps`` DP `fit` steps of dp_step.py's ``kind`` model.

    The TF-ops variants are traced with the native noise op switched off for the noise
    stage only (every other layer path is the default's, native Conv2D op included)."""
    data = dp_step._dataset(kind, batch_size)  # pylint: disable=protected-access
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    def make(mode, use_native):
        model = make_private(dp_step._model(kind),  # pylint: disable=protected-access
                             options=EngineOptions(noise=mode))
        model.compile(DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                          learning_rate=0.15), loss=per_example)
        run = lambda steps: model.fit(data, steps_per_epoch=steps, epochs=1, verbose=0)
        draw = noise_stage.randomness.gaussian_noise_like
        if not use_native:  # the noise stage's draw by TF ops; every other op as by default
            noise_stage.randomness.gaussian_noise_like = (
                lambda *args, **kwargs: draw(*args, **{**kwargs, "native": False}))
        try:
            run(1)  # traced now, with or without the op
        finally:
            noise_stage.randomness.gaussian_noise_like = draw
        return run

    return {label: make(mode, use) for label, mode, use in _variants(modes, with_native)}


def _table(title, results):
    base_wall, base_cpu, _ = results["gaussian"]
    lines = [f"\n{title}\n", "| noise | ms | × gaussian | CPU ms | × gaussian | peak MiB |",
             "|---|---:|---:|---:|---:|---:|"]
    for mode, (wall, cpu, peak) in results.items():
        lines.append(f"| {mode} | {wall:.2f} | {wall / base_wall:.2f} | {cpu:.2f} | "
                     f"{cpu / base_cpu:.2f} | {peak / 2**20:.0f} |")
    print("\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="1000000,3200000",
                        help="comma-separated numbers of noise values for part 1 ('' skips it)")
    parser.add_argument("--model", default="mnist", help="dp_step.py's --model for part 2 "
                        "('' skips it): mnist, cifar10, text, conv1d, mobilenet, lstm")
    parser.add_argument("--modes", default=",".join(NOISE_MODES),
                        help="comma-separated EngineOptions.noise samplers")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--draws", type=int, default=20, help="timed draws per round")
    parser.add_argument("--steps", type=int, default=10, help="timed DP steps per round")
    parser.add_argument("--keras", choices=("2", "3"), help="as in dp_step.py")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    # dp_step.py's synthetic batch is a plain pipeline, accounted as shuffled: not timed here.
    warnings.filterwarnings("ignore", message="fit on a pipeline tf_tempered did not build")
    if args.keras is not None and int(args.keras) != dp_step.KERAS_MAJOR:
        raise SystemExit(f"--keras={args.keras} asked, but this process runs Keras "
                         f"{dp_step.KERAS_MAJOR}: run noise_modes.py as a program (use =).")
    env = dp_step.environment()
    print(f"Keras {env['keras_version']} ({env['keras_module']}), TF {env['tensorflow']}, "
          f"Python {env['python']}, {env['cpus']} CPUs; load average before "
          f"{dp_step._loads(env['load_average'])}")  # pylint: disable=protected-access
    with_native = native.usable()
    print(f"native noise op: {'built and used' if with_native else 'not available'}")
    results = {"environment": env, "native_noise_op": with_native, "draws": {}, "steps": {}}
    modes = [m for m in args.modes.split(",") if m]
    if "gaussian" not in modes or not set(modes) <= set(NOISE_MODES):
        raise SystemExit(f"--modes: a subset of {','.join(NOISE_MODES)} with gaussian "
                         f"(the ratios' base); got {args.modes!r}")
    for size in [int(p) for p in args.params.split(",") if p]:
        results["draws"][size] = interleaved(draw_runs(size, modes, with_native=with_native),
                                             args.rounds, args.draws)
        _table(f"Noise draw alone, {size:,} values (median of {args.rounds} rounds of "
               f"{args.draws} draws)", results["draws"][size])
    if args.model:
        runs = step_runs(args.model, args.batch_size, modes, with_native=with_native)
        results["steps"][args.model] = interleaved(runs, args.rounds, args.steps)
        _table(f"One DP step, {args.model} model, batch {args.batch_size} (median of "
               f"{args.rounds} rounds of {args.steps} steps)", results["steps"][args.model])
    after = dp_step.environment()["load_average"]
    print(f"\nload average after {dp_step._loads(after)}")  # pylint: disable=protected-access
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
