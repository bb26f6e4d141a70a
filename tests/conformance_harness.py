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
"""The conformance harness: every handler against the one float64 per-microbatch reference.

Shared test helper (tests/ is on sys.path: it is not a package) of the family test files
tests/test_conformance_<family>.py, one per family of tests/conformance_cases.py. Each
family file parametrizes its tests with the functions here and runs the checks here.

One engine step (noise 0) of a case's model equals DP-SGD written out with one float64
GradientTape per microbatch (dp_reference.py; clip norm = median of the reference norms:
a mix of clipped and unclipped microbatches; all clipped for M = 1), for M = batch, a
divisor and 1, static and unknown batch size, and every path the handler can take.

Coverage without the full product (path × M × batch kind, 6 runs per path): a case with
one path runs all 6 (M, batch kind) combinations; otherwise each path runs 3 of them,
every M once, alternating between the two complementary patterns A and B below from one
path to the next (so each path sees M = batch, 4 and 1, static and unknown batch sizes,
and each case every (M, batch kind) pair; the cases with the recurrent unit's VJP, slow to
trace, see ConformanceCase.recurrent_vjp). Pattern A, the first path's (the handler's
automatic choice), holds the per-step decisions of an unknown batch size with M = batch
(the microbatch count is a tensor). The model's reference is computed once per
(case, M). That whole matrix runs with ``--extended``; the default run takes the
covering subset of HANDLER_COVER (tests/conftest.py's cover_each) of each case's
default_paths and, for the two-pass modes, the subset chosen by two_pass_params.

Adding a layer type = a handler in tf_tempered/privacy/layer_grads/ + one ConformanceCase
in its family of tests/conformance_cases.py (a new family: a new
tests/test_conformance_<family>.py like the others).
"""

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conformance_cases import CASES, CASES_BY_FAMILY, FAMILY_OF
from conftest import extended_run
from dp_reference import BATCH, assert_engine_matches_reference, onednn_conv_gradients, seeded
from dp_reference import skip_without_onednn_conv_gradients
from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered import keras_bridge
from tf_tempered.privacy import EngineOptions, layer_grads, recording
from tf_tempered.privacy import native

TESTS_DIR = pathlib.Path(__file__).resolve().parent

# (M, static batch size) combinations; see the module docstring.
M_IDS = {None: "M=batch", 4: "M=4", 1: "M=1"}
PATTERN_A = [(None, False), (4, True), (1, False)]
PATTERN_B = [(None, True), (4, False), (1, True)]


# The per-path reference tests' axes: static and unknown batch size; one microbatch per
# example, or 4.
BATCH_KINDS = pytest.mark.parametrize("static_batch", [False, True],
                                      ids=["dynamic-batch", "static-batch"])
SOME_MICROBATCHES = pytest.mark.parametrize("num_microbatches", [None, 4])


def recorded_call(layer, *args, **kwargs):
    """(outputs with the recorder active, the records) of one eager call of `layer` (the
    handler-level tests of recurrent units: tests/test_rnn_rows.py, tests/test_conv_lstm.py)."""
    recording.instrument(keras.Sequential([layer]))  # its cell is part of the unit
    recorder = recording.Recorder()
    with recorder.active():
        out = layer(*args, **kwargs)
    return out, recorder.records


def family_test_file(family):
    """The test file of a family of conformance cases."""
    return TESTS_DIR / f"test_conformance_{family}.py"


def _recurrent_vjp_cases():
    return [name for name, case in CASES.items() if case.recurrent_vjp]


def combinations(name):
    """{path: [(M, static batch)]} of a case (the module docstring)."""
    case = CASES[name]
    if case.recurrent_vjp:
        i = _recurrent_vjp_cases().index(name)
        return {"vectorized": [PATTERN_A[i]], "map_fn": (PATTERN_A, PATTERN_B)[i % 2]}
    if len(case.paths) == 1:
        return {path: PATTERN_A + PATTERN_B for path in case.paths}
    return {path: (PATTERN_A, PATTERN_B)[i % 2] for i, path in enumerate(case.paths)}


def _batch_id(m, static):
    return f"{M_IDS[m]}-{'static' if static else 'dynamic'}-batch"


def _extended_only(name, path):
    """Whether a case's path runs with --extended only: on Keras 3 the recurrent cases'
    tf.map_fn path (what Keras 2 always takes, and Keras 3 with
    EngineOptions(vectorize_recurrent=False); the Keras 2 suite runs every recurrent case on
    it), and the paths outside a case's default_paths."""
    default_paths = CASES[name].default_paths
    return (KERAS_MAJOR == 3 and path == "map_fn") or (
        default_paths is not None and path not in default_paths)


_HANDLER_PARAMS = [
    pytest.param(name, path, m, static, id=f"{name}-{path}-{_batch_id(m, static)}",
                 marks=[pytest.mark.extended] if _extended_only(name, path) else [])
    for name in CASES for path, pairs in combinations(name).items() for m, static in pairs]

# The default run covers, on Keras 3, every (case, path) (M and the static or dynamic batch
# rotating with the patterns); on Keras 2 every case: Keras 2 shares the handlers'
# math and the step, and differs in the bridge (recording, fused recurrent kernels), which
# every case exercises. --extended runs all. (Per case: the same whichever files run.)
HANDLER_COVER = (("case", "path"),) if KERAS_MAJOR == 3 else ("case",)


def handler_params(family=None):
    """(case, path, num_microbatches, static_batch) parameters of a family (None: all)."""
    return [p for p in _HANDLER_PARAMS if family is None or FAMILY_OF[p.values[0]] == family]


# clipped_sum="second_pass" (ghost clipping in two backward passes) and "recompute" (the
# same with a second forward pass) on every case: each case takes one (M, batch) pair of
# the two patterns in turn (in CASES order, shifted by three for "recompute"), so that
# together the cases cover every pair in both modes; the norms still come from each
# handler's default path.
# The recurrent-VJP cases (slow to trace) run in "second_pass" mode only: "recompute"
# computes the same norms, and what it adds for them (no random draw in a cell without
# dropout) is checked by test_recompute_takes_recurrent_cells_without_dropout in
# test_second_pass.py.
# "norms_after_backward": the one-pass book-keeping sum with its norms computed after the
# backward pass (EngineOptions(norms_in_backward=False)), the default before it computed
# them inside (the handler tests above run the default).
TWO_PASS_MODES = {"second_pass": 0, "recompute": 3, "norms_after_backward": 1}


def two_pass_options(mode):
    """The EngineOptions of a TWO_PASS_MODES mode."""
    if mode == "norms_after_backward":
        return EngineOptions(norms_in_backward=False)
    return EngineOptions(clipped_sum=mode)


def _two_pass_params():
    params, covered = [], set()
    for mode, shift in TWO_PASS_MODES.items():
        for i, name in enumerate(CASES):
            if mode != "second_pass" and CASES[name].recurrent_vjp:
                continue
            m, static = (PATTERN_A + PATTERN_B)[(i + shift) % 6]
            # The default run: each mode with each (M, batch kind) once, its first case in
            # CASES order (chosen over all families here, not per test file, so that the
            # default run holds 12 of them whichever family files it collects).
            first = (mode, m, static) not in covered
            covered.add((mode, m, static))
            params.append(pytest.param(mode, name, m, static,
                                       id=f"{mode}-{name}-{_batch_id(m, static)}",
                                       marks=[] if first else [pytest.mark.extended]))
    return params


_TWO_PASS_PARAMS = _two_pass_params()


def two_pass_params(family=None):
    """(mode, case, num_microbatches, static_batch) parameters of a family (None: all)."""
    return [p for p in _TWO_PASS_PARAMS if family is None or FAMILY_OF[p.values[1]] == family]


def case_names(family):
    return [case.name for case in CASES_BY_FAMILY[family]]


def case_labels():
    """The labels of every case's batch: BATCH draws of 3 classes, the same for all."""
    return np.random.default_rng(1).integers(0, 3, BATCH)


def random_batch(shape, seed=0):
    """(x, y) of the per-path reference tests: BATCH normal inputs of `shape`, 3 classes."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(BATCH,) + shape), rng.integers(0, 3, BATCH)


def check_handler_update(name, path, num_microbatches, static_batch):
    """The engine's update on one path of a case equals the float64 reference."""
    case = CASES[name]
    if case.onednn_only:
        skip_without_onednn_conv_gradients()
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    assert_engine_matches_reference(seeded(case.build), case.inputs(num_microbatches or 0),
                                    case_labels(), num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    options=EngineOptions(**case.paths[path]),
                                    cache_key=("conformance", name, num_microbatches))


def check_two_pass_update(mode, name, num_microbatches, static_batch):
    """The engine's update with clipped_sum=mode on a case equals the float64 reference."""
    case = CASES[name]
    if case.onednn_only:
        skip_without_onednn_conv_gradients()
    assert_engine_matches_reference(seeded(case.build), case.inputs(num_microbatches or 0),
                                    case_labels(), num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    options=two_pass_options(mode),
                                    cache_key=("conformance", name, num_microbatches))


def _trainable_layers(model):
    """The layers that own trainable weights (MultiHeadAttention's are its EinsumDense;
    a recurrent layer owns its cells')."""
    nested = keras_bridge.inside_recurrent_units(model)
    return [layer for layer in keras_bridge.flatten_layers(model)
            if keras_bridge.own_trainable_weights(layer) and id(layer) not in nested]


def check_layers_take_their_handlers(name):
    case = CASES[name]
    model = case.build("float32")
    names = {}
    for layer in _trainable_layers(model):
        names.setdefault(type(layer).__name__, set()).add(layer_grads.lookup(layer)[0].name)
    assert names == {k: set(v) if isinstance(v, frozenset) else {v}
                     for k, v in case.expected_handlers.items()}


def run_onednn_only_cases_in_subprocess(request):
    """Without oneDNN (e.g. an AVX2-only CPU) TensorFlow cannot differentiate Keras 3's
    dilated transposed convolutions, so those cases skip; they then run here in
    a subprocess with TF_ENABLE_ONEDNN_OPTS=1 (each case once, every path of each with
    --extended, and one two-pass run), from their family files."""
    if onednn_conv_gradients():
        pytest.skip("this process runs the oneDNN-only cases itself")
    # Each oneDNN-only case once (its first path; every path with --extended).
    key_size = 2 if extended_run(request.config) else 1
    firsts = {}
    for p in _HANDLER_PARAMS:
        if CASES[p.values[0]].onednn_only:
            firsts.setdefault(p.values[:key_size], p)
    ids = [f"{family_test_file(FAMILY_OF[p.values[0]])}"
           f"::test_handler_update_equals_per_microbatch_reference[{p.id}]"
           for p in firsts.values()]
    ids += [f"{family_test_file(FAMILY_OF[p.values[1]])}"
            f"::test_two_pass_clipped_sum_equals_per_microbatch_reference[{p.id}]"
            for p in _TWO_PASS_PARAMS if CASES[p.values[1]].onednn_only][:1]
    # --extended: the ids asked for run even where the default run would skip them.
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "--extended", *ids],
                         env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1"),
                         cwd=TESTS_DIR.parent, capture_output=True, text=True, timeout=1800,
                         check=False)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    if run.returncode == 0 and "passed" not in summary:
        pytest.skip(f"oneDNN cannot be turned on here either: {summary}")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{len(ids)} passed" in summary, summary


def family_tests(family):
    """The three tests every family file runs on its cases, for the file to bind:

        (test_handler_update_equals_per_microbatch_reference,
         test_two_pass_clipped_sum_equals_per_microbatch_reference,
         test_each_layer_takes_its_handler) = family_tests("dense")
    """
    @pytest.mark.cover_each(*HANDLER_COVER)
    @pytest.mark.parametrize("case,path,num_microbatches,static_batch", handler_params(family))
    def test_handler_update_equals_per_microbatch_reference(case, path, num_microbatches,
                                                            static_batch):
        check_handler_update(case, path, num_microbatches, static_batch)

    # The default run: each mode with each (M, batch kind) once over all the families
    # (two_pass_params).
    @pytest.mark.parametrize("mode,case,num_microbatches,static_batch",
                             two_pass_params(family))
    def test_two_pass_clipped_sum_equals_per_microbatch_reference(mode, case, num_microbatches,
                                                                  static_batch):
        check_two_pass_update(mode, case, num_microbatches, static_batch)

    @pytest.mark.parametrize("case", case_names(family))
    def test_each_layer_takes_its_handler(case):
        check_layers_take_their_handlers(case)

    return (test_handler_update_equals_per_microbatch_reference,
            test_two_pass_clipped_sum_equals_per_microbatch_reference,
            test_each_layer_takes_its_handler)
