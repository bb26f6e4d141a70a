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
"""The conformance matrix as a whole (tests/conformance_harness.py), across the families.

Its parametrizations cover every (M, batch kind) pair on every path of every case and in
both two-pass modes; every family of tests/conformance_cases.py has its test file; the
oneDNN-only cases run in a subprocess where this process cannot run them; README's table
of supported layers is the registry's.
"""

import pathlib

import pytest

from conformance_cases import CASES, CASES_BY_FAMILY
from conformance_harness import (M_IDS, PATTERN_A, PATTERN_B, TWO_PASS_MODES, combinations,
                                 family_test_file, run_onednn_only_cases_in_subprocess,
                                 two_pass_params)
from tf_tempered._compat import KERAS_MAJOR
from tf_tempered.privacy import layer_grads


def test_the_combinations_cover_every_pair():
    # Every case runs: its family has a test file.
    for family in CASES_BY_FAMILY:
        assert family_test_file(family).is_file(), family
    for case in CASES:
        recurrent_vjp = CASES[case].recurrent_vjp
        pairs_of_path = combinations(case)
        assert set(pairs_of_path) == set(CASES[case].paths), case
        for path, pairs in pairs_of_path.items():
            if recurrent_vjp and path == "vectorized":
                continue
            assert {m for m, _ in pairs} == set(M_IDS), (case, path)
            assert {static for _, static in pairs} == {False, True}, (case, path)
        if recurrent_vjp:
            continue
        assert set().union(*map(set, pairs_of_path.values())) == set(PATTERN_A + PATTERN_B)
        assert (None, False) in next(iter(pairs_of_path.values())), case
    # The recurrent-VJP cases together: every pair on "map_fn", every M on "vectorized".
    recurrent = [combinations(c) for c in CASES if CASES[c].recurrent_vjp]
    assert set().union(*(map(tuple, r["map_fn"]) for r in recurrent)) == set(
        PATTERN_A + PATTERN_B)
    assert {m for r in recurrent for m, _ in r["vectorized"]} == set(M_IDS)


def test_two_pass_cases_cover_every_pair():
    params = two_pass_params()
    for mode in TWO_PASS_MODES:  # (the recurrent cases' three pairs are in pattern A + B too)
        assert {(m, static) for p in params if p.values[0] == mode
                for m, static in [p.values[2:]]} == set(PATTERN_A + PATTERN_B), mode
        # The default run: each pair once.
        default = [p.values[2:] for p in params if p.values[0] == mode and not p.marks]
        assert sorted(default, key=repr) == sorted(PATTERN_A + PATTERN_B, key=repr), mode


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="the Keras 3 suite runs the oneDNN-only cases")
def test_onednn_only_cases_run_with_onednn_where_this_process_cannot(request):
    """Without oneDNN (e.g. an AVX2-only CPU) TensorFlow cannot differentiate Keras 3's
    dilated transposed convolutions, so that case skips; it then runs here in a subprocess
    with TF_ENABLE_ONEDNN_OPTS=1 (once, every path with --extended, and one two-pass run
    if the default run has one)."""
    run_onednn_only_cases_in_subprocess(request)


def test_readme_supported_layers_table_is_generated_from_the_registry():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert layer_grads.supported_layers_markdown() in readme
