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
"""What the peer benchmarks share: arguments, synthetic data, the interleaved timing rounds,
the peak-RSS probe and the markdown table (benchmarks/dp_step.py's design and format).

Imports numpy and the standard library only (no TensorFlow, no tf_tempered), so that each
peer script runs in an environment that has only its own framework.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

# The shapes and DP arguments of benchmarks/dp_step.py.
TEXT_VOCAB, TEXT_LENGTH, TEXT_DIM, TEXT_HEADS = 50_000, 64, 64, 4
NUM_CLASSES = 10
L2_NORM_CLIP = 1.0
NOISE_MULTIPLIER = 1.1
LEARNING_RATE = 0.15
INSTALL_HINT = "pip install -e .[peers]"


def require(*packages):
    """Exits 0 with a "skipped" line when one of ``packages`` (import names) is missing."""
    for package in packages:
        if importlib.util.find_spec(package) is None:
            print(f"skipped: {package} not installed ({INSTALL_HINT})")
            sys.exit(0)


def parse_args(description, paths):
    """The flags every peer script takes (those of dp_step.py that apply, and --selfcheck)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", choices=("mnist", "text"), default="mnist")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--paths", default=",".join(paths), help=f"from {','.join(paths)}")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--noise_multiplier", type=float, default=NOISE_MULTIPLIER)
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--selfcheck", action="store_true",
                        help="check every path's clipped sum against a per-example loop on a "
                             "tiny batch, and that the non-private step trains; no timing")
    args = parser.parse_args()
    unknown = [p for p in args.paths.split(",") if p not in paths]
    if unknown:
        parser.error(f"unknown path(s) {', '.join(unknown)}: choose from {', '.join(paths)}")
    return args


def synthetic_batch(kind, batch_size, seed=0):
    """Inputs of the real shapes, as in dp_step.py: images in [0, 1) as [B, 28, 28, 1]
    (NHWC), or token ids in [0, 50 000) as [B, 64]; labels in [0, 10)."""
    rng = np.random.default_rng(seed)
    if kind == "text":
        x = rng.integers(0, TEXT_VOCAB, (batch_size, TEXT_LENGTH)).astype(np.int64)
    else:
        x = rng.random((batch_size, 28, 28, 1), dtype=np.float32)
    return x, rng.integers(0, NUM_CLASSES, batch_size).astype(np.int64)


def load_average():
    return list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def environment(versions):
    """The machine and the framework versions, recorded with every result."""
    return dict(versions, python=platform.python_version(),
                processor=platform.processor() or platform.machine(), cpus=os.cpu_count(),
                load_average=load_average())


def _release_freed_memory():
    """Hands memory that glibc's malloc holds but no longer uses back to the kernel, so that
    one path's peak RSS does not count what an earlier path freed (glibc only)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _reset_peak_rss():
    """Resets the kernel's high-water mark of this process's RSS (Linux; else a no-op)."""
    _release_freed_memory()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def time_rounds(steps, n_steps, rounds):
    """Runs ``rounds`` rounds; each round runs every path's ``step()`` ``n_steps`` times, path
    after path, so that machine noise hits all paths alike. ``step()`` must return only when
    its work is done. Returns per-path lists of wall and CPU (all threads) ms/step, and each
    path's peak process RSS (the high-water mark is reset before each of its runs)."""
    times = {p: [] for p in steps}
    cpu_times = {p: [] for p in steps}
    peaks = {p: 0 for p in steps}
    for _ in range(rounds):
        for p, step in steps.items():
            _reset_peak_rss()
            start, cpu_start = time.perf_counter(), time.process_time()
            for _ in range(n_steps):
                step()
            times[p].append((time.perf_counter() - start) / n_steps * 1000)
            cpu_times[p].append((time.process_time() - cpu_start) / n_steps * 1000)
            peaks[p] = max(peaks[p], _peak_rss_bytes())
    return times, cpu_times, peaks


def run(description, all_paths, *, versions, selfcheck, build_step, title):
    """A peer script's main: flags; --selfcheck; else each path's step (``build_step(args,
    path)``, called twice to compile and warm up outside the timed rounds), timed in
    interleaved rounds and reported as ``title``."""
    args = parse_args(description, all_paths)
    paths = args.paths.split(",")
    if args.selfcheck:
        selfcheck(args, paths)  # exits
    env = environment(versions())
    steps = {}
    for path in paths:
        steps[path] = build_step(args, path)
        steps[path]()
        steps[path]()
    times, cpu_times, peaks = time_rounds(steps, args.steps, args.rounds)
    report(f"{args.model} model, {title}", args, env, times, cpu_times, peaks)


def _loads(values):
    return "/".join(f"{v:.2f}" for v in values) if values else "n/a"


def report(title, args, env, times, cpu_times, peaks):
    """Prints dp_step.py's table (ratios to the path "nonprivate") and writes --json."""
    env = dict(env, load_average_before=env["load_average"], load_average_after=load_average())
    del env["load_average"]
    versions = ", ".join(f"{k} {v}" for k, v in env.items()
                         if k not in ("processor", "cpus", "load_average_before",
                                      "load_average_after"))
    print(f"\n{title}, batch {args.batch_size}, {env['processor']}, {env['cpus']} CPUs, "
          f"{versions}; load average (1/5/15 min) before {_loads(env['load_average_before'])}, "
          f"after {_loads(env['load_average_after'])}")
    print("| path | ms/step | × non-private | CPU ms/step | × non-private | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    base = statistics.median(times["nonprivate"]) if "nonprivate" in times else None
    cpu_base = statistics.median(cpu_times["nonprivate"]) if base else None
    rows = []
    for p in times:
        ms, cpu_ms = statistics.median(times[p]), statistics.median(cpu_times[p])
        row = {"path": p, "ms_per_step": ms, "cpu_ms_per_step": cpu_ms, "peak_rss_bytes": peaks[p],
               "time_ratio": ms / base if base else None,
               "cpu_ratio": cpu_ms / cpu_base if base else None}
        rows.append(row)
        print(f"| {p} | {ms:.1f} | {row['time_ratio'] or float('nan'):.2f} | {cpu_ms:.1f} | "
              f"{row['cpu_ratio'] or float('nan'):.2f} | {peaks[p] / 2**20:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "environment": env, "rows": rows, "times": times,
                       "cpu_times": cpu_times}, f, indent=1)
    return rows


def check_close(name, got, want, rtol=1e-4, atol=1e-6):
    """One selfcheck line; returns whether ``got`` matches ``want`` (numpy arrays)."""
    error = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    ok = bool(np.allclose(got, want, rtol=rtol, atol=atol + rtol * scale))
    print(f"selfcheck {name}: max |difference| {error:.2e} (largest value {scale:.2e}) "
          f"{'OK' if ok else 'FAILED'}")
    return ok


def check_noise_std(name, got_std, want_std, tolerance=0.1):
    ok = abs(got_std / want_std - 1) < tolerance
    print(f"selfcheck {name}: noise std per coordinate {got_std:.3e}, expected {want_std:.3e} "
          f"{'OK' if ok else 'FAILED'}")
    return ok


def check_trains(name, losses):
    ok = losses[-1] < 0.9 * losses[0]
    print(f"selfcheck {name}: loss {losses[0]:.4f} -> {losses[-1]:.4f} over {len(losses) - 1} "
          f"steps {'OK' if ok else 'FAILED'}")
    return ok


def finish_selfcheck(results):
    """Prints the summary line and exits non-zero when a check failed."""
    failed = sum(not ok for ok in results)
    print(f"selfcheck: {len(results) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
