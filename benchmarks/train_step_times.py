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
"""Where the train script's DP-SGD time goes: the step time inside ``fit``, per sampling.

``end_to_end.py`` times whole processes; this splits a run of the train script into
its first batch (tracing) and the median time of the other batches, for three runs of
one command, each in a fresh process, the three in turn for ``--rounds`` rounds:

- ``dp_poisson``: DP-SGD as the script runs it (Poisson batches, padded to a fixed
  size that a step overflows with probability < 1e-10 over the run, with a mask);
- ``dp_shuffle``: DP-SGD with ``--sampling=shuffle`` (fixed-size batches, the weaker
  shuffle ε): the same engine without the padding;
- ``dp_poisson_unpadded``: ``--nopoisson_padding`` (the same Poisson batches without the
  padding rows: the same update and ε, but the step's time follows the secret batch size);
- ``nonprivate``: ``--nodpsgd``.

``dp_poisson / dp_shuffle`` is the cost of the padding, ``dp_shuffle / nonprivate``
that of the engine at the same batch.

    python benchmarks/train_step_times.py                 # MNIST, 2 epochs, 2 rounds
    python benchmarks/train_step_times.py --rounds=3 --json=benchmarks/results/train_step_times_mnist.json
    python benchmarks/train_step_times.py --render=benchmarks/results/train_step_times_mnist.json
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import process_runs  # noqa: E402

DEFAULT_TRAIN_ARGS = "--dataset=mnist --data_dir=../shared/data --epochs=2 --nosave_model"
RUNS = {"dp_poisson": [], "dp_shuffle": ["--sampling=shuffle"],
        "dp_poisson_unpadded": ["--nopoisson_padding"], "nonprivate": ["--nodpsgd"]}


def _one_run(train_args):
    """In this process: the train script's run with a per-batch timer; prints its JSON."""
    from absl import flags

    from tf_tempered._compat import keras
    from tf_tempered.experiments import command_line, train

    class BatchTimes(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.monotonic()

        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.monotonic() - self.start)

        def on_train_begin(self, logs=None):
            self.times = []

    timer, num_examples = BatchTimes(), []

    def callbacks(model, dataset):
        num_examples.append(len(dataset.y_train))
        return [timer]

    train.define_flags()
    flags.FLAGS(["train"] + shlex.split(train_args))
    config = command_line.config_from_flags(flags.FLAGS)
    result = train.run_training(config, verbose=0, extra_callbacks=callbacks)
    rows = config.batch_size
    if config.dpsgd and config.sampling == "poisson" and config.poisson_padding:
        # The padded size the batches had (unpadded: about batch_size on average).
        from tf_tempered.privacy import sampling
        rows = sampling.default_max_batch_size(
            num_examples=num_examples[0], sampling_probability=config.batch_size / num_examples[0],
            total_steps=result["steps"])
    print(json.dumps({"first_batch_s": timer.times[0],
                      "median_step_ms": 1000 * statistics.median(timer.times[1:]),
                      "steps": len(timer.times), "wall_time_s": result["wall_time_s"],
                      "batch_rows": rows, "epsilon": result.get("epsilon")}))


def run_rounds(train_args, rounds, timeout):
    """``rounds`` × the three runs, each in a fresh process; the raw results."""
    results = {name: [] for name in RUNS}
    for i in range(rounds):
        for name, extra in RUNS.items():
            args = " ".join([train_args, *extra])
            out = subprocess.run([sys.executable, __file__, "--one", args], check=True,
                                 capture_output=True, text=True, timeout=timeout)
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {i + 1}/{rounds} {name}: median step "
                  f"{results[name][-1]['median_step_ms']:.2f} ms", file=sys.stderr)
    return results


def render(result):
    """The markdown table of a result (as written by --json)."""
    runs = result["runs"]
    median = {name: statistics.median(r["median_step_ms"] for r in runs[name]) for name in runs}
    lines = [f"Train script step times: `python -m tf_tempered.experiments.train "
             f"{result['train_args']}` [+ "
             + " | ".join(f"`{' '.join(RUNS[name])}`" for name in runs if RUNS.get(name))
             + "], "
             f"{len(runs['nonprivate'])} round(s) of fresh processes ({result['environment']}); "
             f"load average before {result['load_before']}, after {result['load_after']}", "",
             "| run | median step (ms; per round) | × non-private | first batch (s) | "
             "rows per step (padded; else the batch size) |", "|---|---|---:|---|---:|"]
    for name, rs in runs.items():
        per_round = ", ".join(f"{r['median_step_ms']:.2f}" for r in rs)
        first = ", ".join(f"{r['first_batch_s']:.2f}" for r in rs)
        lines.append(f"| {name} | {median[name]:.2f} ({per_round}) | "
                     f"{median[name] / median['nonprivate']:.2f} | {first} | "
                     f"{rs[0]['batch_rows']} |")
    lines += ["", f"Padding (dp_poisson / dp_shuffle): "
                  f"{median['dp_poisson'] / median['dp_shuffle']:.2f}; engine at the same batch "
                  f"(dp_shuffle / nonprivate): {median['dp_shuffle'] / median['nonprivate']:.2f}."]
    if "dp_poisson_unpadded" in median:
        lines[-1] += (f" Unpadded Poisson batches (dp_poisson_unpadded / nonprivate): "
                      f"{median['dp_poisson_unpadded'] / median['nonprivate']:.2f}.")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train_args", default=DEFAULT_TRAIN_ARGS,
                        help="the train script's flags (without --sampling and --nodpsgd)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the four runs")
    process_runs.add_output_arguments(parser)
    parser.add_argument("--one", metavar="TRAIN_ARGS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one is not None:
        return _one_run(args.one)
    if args.render:
        return process_runs.render_file(args.render, render)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    for flag in ("--sampling", "--nodpsgd", "--dpsgd", "poisson_padding"):
        if flag in args.train_args:
            parser.error(f"--train_args must not set {flag}: the script sets it per run")
    load_before = process_runs.load_average()
    runs = run_rounds(args.train_args, args.rounds, args.timeout)
    return process_runs.finish({"train_args": args.train_args, "runs": runs},
                               load_before=load_before, json_path=args.json, render=render)


if __name__ == "__main__":
    main()
