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
"""Result files of the experiment scripts: strict JSON, CSV, resumable runs, Agg figures.

>>> _plain({"epsilon": float("inf"), "steps": np.int64(3)})
{'epsilon': 'inf', 'steps': 3}
"""

import importlib.metadata
import json
import math
import os
import pathlib
import sys

import numpy as np  # noqa: F401  (used by the doctest)

from tf_tempered.experiments.common import ConfigError, TrainConfig, validate_config
from tf_tempered.version import __version__

__all__ = ["package_versions", "peak_rss_mib", "write_json", "read_json", "write_csv",
           "run_all"]


def package_versions():
    """Versions of the packages a result depends on."""
    versions = {"tf_tempered": __version__}
    for package in ("tensorflow", "keras", "tf-keras", "tensorflow-privacy", "dp-accounting",
                    "numpy"):
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def peak_rss_mib():
    """This process's peak resident memory so far, in MiB (None where the OS does not say).

    >>> peak_rss_mib() > 0
    True
    """
    try:
        import resource  # pylint: disable=g-import-not-at-top  (Unix only)
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2 ** 20 if sys.platform == "darwin" else peak / 2 ** 10


def _plain(value):
    """JSON-safe copy: NumPy scalars to Python, non-finite floats to "inf"/"-inf"/"nan"."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # strict JSON has no Infinity; float("inf") reads it back
    return value


def write_json(path, data):
    """Writes ``data`` as strict JSON atomically (a crash leaves no half-written file)."""
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_plain(data), indent=2, allow_nan=False) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def read_json(path):
    """The JSON at ``path`` (non-finite numbers stay the strings "inf", "nan")."""
    with open(path) as f:
        return json.load(f)


def run_all(runs_dir, runs, run, *, verbose=1):
    """Runs each ``(name, config)`` of ``runs`` with ``run(config)`` unless already done.

    Each result is stored as ``runs_dir/<name>.json``; a later call reads it instead of
    training again (so an interrupted sweep resumes). Every config is validated, and
    every stored run's settings compared, before any training: a resumed sweep must
    not mix settings (another budget, more epochs...) into one figure.

    Returns ``({name: result}, number of runs trained by this call)``.
    """
    runs_dir = pathlib.Path(runs_dir)
    names = [name for name, _ in runs]
    if len(set(names)) != len(names):
        raise ValueError(f"run names must be unique, got {names}.")
    done, todo = {}, []
    for name, config in runs:
        validate_config(config)
        path = runs_dir / f"{name}.json"
        if not path.is_file():
            todo.append((name, config, path))
            continue
        stored = read_json(path)
        flags, wanted = stored.get("flags") or {}, _plain(config.to_dict())
        # A flag added since the run was stored (absent there) matches its default.
        defaults = _plain(TrainConfig().to_dict())
        diff = sorted(k for k in set(wanted) | set(flags)
                      if wanted.get(k) != flags.get(k, defaults.get(k)))
        if diff:
            raise ConfigError(f"{path} holds a run with other settings (differing: "
                              f"{', '.join(diff)}). Fix: use a new --output_dir for new "
                              "settings, or delete that file.")
        done[name] = stored
    if verbose and done:
        print(f"Resuming: {len(done)} of {len(runs)} runs already in {runs_dir}.", flush=True)
    for i, (name, config, path) in enumerate(todo):
        if verbose:
            print(f"[{i + 1}/{len(todo)}] {name}", flush=True)
        write_json(path, dict(run(config)))
        done[name] = read_json(path)  # the stored form, as a resumed call sees it
    return {name: done[name] for name in names}, len(todo)


def write_csv(path, rows, columns):
    """Writes ``rows`` (dicts) as CSV with ``columns``."""
    import csv  # pylint: disable=g-import-not-at-top
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(_plain(rows))
