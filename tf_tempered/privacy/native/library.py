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
"""Building and loading the native ops' library (see the package's docstring).

The C++ sources in cc/ are compiled with the machine's C++ compiler against the installed
TensorFlow the first time an op is needed (once per machine and TensorFlow version) and
cached under ``$TF_TEMPERED_CACHE_DIR`` (default ``~/.cache/tf_tempered``). Without a
compiler the engine falls back to TF ops with a warning (same results, slower);
``TF_TEMPERED_NATIVE=0`` chooses that fallback silently, ``TF_TEMPERED_NATIVE=1`` makes a
failed build an error.
"""

import concurrent.futures
import contextlib
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: builds are not locked against each other
    fcntl = None

from tf_tempered._compat import tf
from tf_tempered.privacy.errors import NativeBuildError

__all__ = ["available", "build", "library_path", "load", "switched_off", "usable",
           "BUILD_MIN_VALUES"]

_CC = pathlib.Path(__file__).with_name("cc")
_SOURCES = tuple(_CC / name for name in ("conv_kernel_grads.cc", "conv_clipped_sum.cc",
                                         "depthwise_kernel_grads.cc",
                                         "box_muller.cc", "embedding_sq_norms.cc",
                                         "scatter_rows.cc", "row_sq_norms.cc",
                                         "lstm_sequence.cc", "gru_sequence.cc"))
# In the cache key with the sources: an edit rebuilds.
_HEADERS = (_CC / "conv_geometry.h", _CC / "conv_group_grads.h", _CC / "philox.h",
            _CC / "recurrent_blocks.h")
_ENV_SWITCH = "TF_TEMPERED_NATIVE"
_ENV_CACHE = "TF_TEMPERED_CACHE_DIR"
_LOG = logging.getLogger(__name__)

_lock = threading.Lock()
_state = {"loaded": False, "module": None}


def _compiler():
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _flags():
    # -march=native: the library is built on, and cached for, this machine's CPU.
    return (["-std=c++17", "-shared", "-fPIC", "-O3", "-march=native", *_cpu_exclusions(),
             "-w"] + tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags())


@functools.lru_cache(maxsize=None)
def _cpu_exclusions():
    """Instruction sets left out of -march=native: AVX512-FP16 (Intel Sapphire Rapids and
    later), under which the Eigen headers TensorFlow ships (2.21) do not compile
    (PacketMathFP16.h: "expected initializer before '<'"). The ops use no half precision.
    Only where the CPU has it and the compiler knows the switch."""
    if "avx512_fp16" not in _cpu_signature().split():  # /proc/cpuinfo's name
        return ()
    compiler = _compiler()
    if compiler is None:
        return ()
    probe = subprocess.run([compiler, "-mno-avx512fp16", "-x", "c++", "-E", "-", "-o",
                            os.devnull], input="", capture_output=True, text=True,
                           check=False)
    return ("-mno-avx512fp16",) if probe.returncode == 0 else ()


def _cpu_signature():
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("model name", "flags"))]
    return "\n".join(sorted(set(lines)))


def library_path():
    """Where the compiled op for this source, TensorFlow, compiler and CPU is cached."""
    compile_flags, link_flags = _flags()
    key = hashlib.sha256("\n".join([
        *(source.read_text(encoding="utf-8") for source in _SOURCES + _HEADERS),
        tf.__version__, sys.platform, platform.machine(),
        " ".join(compile_flags + link_flags), _cpu_signature(),
    ]).encode()).hexdigest()[:16]
    root = os.environ.get(_ENV_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tf_tempered")
    return pathlib.Path(root) / f"native_ops-{key}.so"


def build():
    """Compiles the op if it is not cached yet; returns the library's path.

    Raises NativeBuildError, with the compiler's output, when that fails.
    """
    path = library_path()
    if path.exists():
        return path
    compiler = _compiler()
    if compiler is None:
        raise NativeBuildError(
            "no C++ compiler found (looked for $CXX, c++, g++, clang++); install one "
            "(e.g. `apt-get install g++`) for the fast native op, or set "
            f"{_ENV_SWITCH}=0 to use TF ops only")
    path.parent.mkdir(parents=True, exist_ok=True)
    with _file_lock(path.with_suffix(".lock")):
        if path.exists():  # another process built it while we waited
            return path
        compile_flags, link_flags = _flags()
        _LOG.warning("tf_tempered: compiling its native ops (per-example convolution and "
                     "depthwise gradients, gradient norms, Embedding norms and sums, DP noise, "
                     "the LSTM's and GRU's time loops; once per machine and TensorFlow "
                     "version, about a minute) into %s", path)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            out = pathlib.Path(tmp) / path.name
            objects = _compile_each(compiler, compile_flags, pathlib.Path(tmp))
            _run_compiler([compiler, "-shared", *map(str, objects), "-o", str(out), *link_flags],
                          "linking " + ", ".join(o.name for o in objects))
            os.replace(out, path)  # atomic: readers never see a partial library
    return path


def _compile_each(compiler, compile_flags, directory):
    """One object file per source, compiled by as many compilers at once as there are CPUs:
    one command for all sources compiles them one after another (measured on 2 vCPUs: 93 s
    that way, 54 s this way; the README's first command and CI's first native test wait for
    it)."""
    objects = [directory / f"{source.stem}.o" for source in _SOURCES]
    commands = [[compiler, *compile_flags, "-c", str(source), "-o", str(obj)]
                for source, obj in zip(_SOURCES, objects)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        list(pool.map(lambda args: _run_compiler(*args),
                      [(command, f"compiling {source.name}")
                       for command, source in zip(commands, _SOURCES)]))
    return objects


def _run_compiler(command, what):
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NativeBuildError(f"{what} failed (exit {result.returncode}):\n"
                               f"{' '.join(command)}\n{result.stderr[-4000:]}")


@contextlib.contextmanager
def _file_lock(path):
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path, "w", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _switch():
    return os.environ.get(_ENV_SWITCH, "").strip().lower()


def switched_off():
    """Whether ``TF_TEMPERED_NATIVE`` turns the native ops off (0, false, off or no)."""
    return _switch() in ("0", "false", "off", "no")


def load():
    """The loaded library's op module, or None (switched off, or it would not build)."""
    with _lock:
        if _state["loaded"]:
            return _state["module"]
        switch = _switch()
        module = None
        if not switched_off():
            try:
                module = tf.load_op_library(str(build()))
            except (NativeBuildError, tf.errors.NotFoundError, OSError) as error:
                if switch in ("1", "true", "on", "yes"):
                    raise NativeBuildError(f"{_ENV_SWITCH}={switch} but the native op is not "
                                           f"usable: {error}") from error
                _LOG.warning("tf_tempered: native ops unavailable, using TF ops for per-example "
                             "conv gradients, Embedding norms and the noise (exact, slower): "
                             "%s", error)
        _state.update(loaded=True, module=module)
        return module


def available():
    """True when the native op is built (or builds now) and loads."""
    return load() is not None


# For the noise or an Embedding of fewer values than this the ops are used only if the
# library is built already: their saving (the noise: ≈ 4 ms a step at 10⁶ values, ≈ 0.4 ms at
# 10⁵; benchmarks/results/noise_native.md) would not repay a first compilation (≈ 1 min)
# in a short run of a small model.
BUILD_MIN_VALUES = 1_000_000


def usable(num_values=None):
    """Whether an op over ``num_values`` values (the noise's, an Embedding's) runs natively.

    No GPU (the ops are CPU-only: on a GPU machine TF's kernels run where the tensors
    are), and the library loads: built now only for ``num_values=None`` or at least
    BUILD_MIN_VALUES values, else only if it is built already (a Conv2D may have built it).
    """
    if tf.config.list_logical_devices("GPU"):
        return False
    if (num_values is not None and num_values < BUILD_MIN_VALUES
            and not _state["loaded"] and not library_path().exists()):
        return False
    return available()


def main():
    """``python -m tf_tempered.privacy.native``: builds the library now and prints where it
    is (or why it cannot be built)."""
    try:
        path = build()
        tf.load_op_library(str(path))
    except (NativeBuildError, tf.errors.NotFoundError, OSError) as error:
        print(f"native op not available: {error}")
        return 1
    print(f"native op ready: {path}")
    return 0
