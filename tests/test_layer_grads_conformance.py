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
"""Every layer_grads handler (and the generic fallback) against a per-microbatch reference.

One engine step (noise 0) of a small model holding the layer equals DP-SGD
written out with one float64 GradientTape per microbatch (dp_reference.py;
clip norm = median of the reference norms: a mix of clipped and unclipped
microbatches; all clipped for M = 1), for M = batch, a divisor and 1, static
and unknown batch size, and every path the handler can take.

Coverage without the full product (path × M × batch kind, 6 runs per path): a
case with one path runs all 6 (M, batch kind) combinations; otherwise each path
runs 3 of them, every M once, alternating between the two complementary
patterns A and B below from one path to the next (so each path sees M = batch,
4 and 1, static and unknown batch sizes, and each case every (M, batch kind)
pair; the recurrent cases, slow to trace, see _RECURRENT). Pattern A, the first path's
(the handler's automatic choice), holds the per-step decisions of an unknown batch size
with M = batch (the microbatch count is a tensor). The model's reference is computed
once per (case, M). That whole matrix runs with ``--extended``; the default run takes
the covering subset of _COVER below (tests/conftest.py).

Adding a layer type = a handler in tf_tempered/privacy/layer_grads/ + one entry
in CASES of tests/conformance_cases.py.
"""

import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from conftest import extended_run
from dp_reference import (BATCH, assert_engine_matches_reference, onednn_conv_gradients,
                          seeded, skip_without_onednn_conv_gradients)
from tf_tempered._compat import KERAS_MAJOR, keras
from tf_tempered.privacy import (DPKerasSGDOptimizer, EngineOptions, keras_bridge, layer_grads,
                                 make_private, native)

from conformance_cases import (CASES, _ONEDNN_ONLY, _RECURRENT, _DenseWithOwnCall,
                               _dilated_conv_transpose, _floats, _generic)


def test_zero_inserted_conv2d_transpose_is_the_dilated_one():
    skip_without_onednn_conv_gradients()
    x = _floats((4, 3, 2), 0).astype("float32")
    ours, theirs = seeded(_dilated_conv_transpose)("float32"), seeded(_dilated_conv_transpose)(
        "float64")
    theirs.set_weights(ours.get_weights())
    np.testing.assert_allclose(theirs(x.astype("float64")).numpy(), ours(x).numpy(), rtol=1e-5,
                               atol=1e-6)


# (M, static batch size) combinations; see the module docstring.
_M_IDS = {None: "M=batch", 4: "M=4", 1: "M=1"}
_PATTERN_A = [(None, False), (4, True), (1, False)]
_PATTERN_B = [(None, True), (4, False), (1, True)]




def _combinations(paths, case=None):
    if case in _RECURRENT:
        i = _RECURRENT.index(case)
        return {"vectorized": [_PATTERN_A[i]], "map_fn": (_PATTERN_A, _PATTERN_B)[i % 2]}
    if len(paths) == 1:
        return {path: _PATTERN_A + _PATTERN_B for path in paths}
    return {path: (_PATTERN_A, _PATTERN_B)[i % 2] for i, path in enumerate(paths)}


# On Keras 3 the recurrent cases' tf.map_fn path (what Keras 2 always takes, and Keras 3 with
# EngineOptions(vectorize_recurrent=False)) runs with --extended only: the Keras 2 suite runs
# every recurrent case on it.
_PARAMS = [
    pytest.param(case, path, m, static,
                 id=f"{case}-{path}-{_M_IDS[m]}-{'static' if static else 'dynamic'}-batch",
                 marks=[pytest.mark.extended] if KERAS_MAJOR == 3 and path == "map_fn" else [])
    for case, (_, _, paths, _) in CASES.items()
    for path, combinations in _combinations(paths, case).items() for m, static in combinations]


def test_the_combinations_cover_every_pair():
    for case, (_, _, paths, _) in CASES.items():
        combinations = _combinations(paths, case)
        assert set(combinations) == set(paths), case
        for path, pairs in combinations.items():
            if case in _RECURRENT and path == "vectorized":
                continue
            assert {m for m, _ in pairs} == set(_M_IDS), (case, path)
            assert {static for _, static in pairs} == {False, True}, (case, path)
        if case in _RECURRENT:
            continue
        assert set().union(*map(set, combinations.values())) == set(_PATTERN_A + _PATTERN_B)
        assert (None, False) in next(iter(combinations.values())), case
    # The recurrent cases together: every pair on "map_fn", every M on "vectorized".
    recurrent = [_combinations(CASES[c][2], c) for c in _RECURRENT]
    assert set().union(*(map(tuple, r["map_fn"]) for r in recurrent)) == set(
        _PATTERN_A + _PATTERN_B)
    assert {m for r in recurrent for m, _ in r["vectorized"]} == set(_M_IDS)


# The default run covers, on Keras 3, every (case, path) (M and the static or dynamic batch
# rotating with the patterns); on Keras 2 every case: Keras 2 shares the handlers'
# math and the step, and differs in the bridge (recording, fused recurrent kernels), which
# every case exercises. --extended runs all.
_COVER = (("case", "path"),) if KERAS_MAJOR == 3 else ("case",)


@pytest.mark.cover_each(*_COVER)
@pytest.mark.parametrize("case,path,num_microbatches,static_batch", _PARAMS)
def test_handler_update_equals_per_microbatch_reference(case, path, num_microbatches,
                                                        static_batch):
    builder, inputs, paths, _ = CASES[case]
    if case in _ONEDNN_ONLY:
        skip_without_onednn_conv_gradients()
    if path.startswith("native") and not native.available():
        pytest.skip("the native op cannot be built here (no C++ compiler)")
    x = inputs(num_microbatches or 0)
    y = np.random.default_rng(1).integers(0, 3, BATCH)
    assert_engine_matches_reference(seeded(builder), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    options=EngineOptions(**paths[path]),
                                    cache_key=("conformance", case, num_microbatches))


# clipped_sum="second_pass" (ghost clipping in two backward passes) and "recompute" (the
# same with a second forward pass) on every case: each case takes one (M, batch) pair of
# the two patterns in turn (shifted by three for "recompute"), so that together the
# cases cover every pair in both modes; the norms still come from each handler's
# default path.
# The recurrent cases (slow to trace) run in "second_pass" mode only: "recompute" computes
# the same norms, and what it adds for them (no random draw in a cell without dropout)
# is checked by test_recompute_takes_recurrent_cells_without_dropout in test_second_pass.py.
_TWO_PASS_MODES = {"second_pass": 0, "recompute": 3}
_SECOND_PASS = [
    pytest.param(mode, case, *(_PATTERN_A + _PATTERN_B)[(i + shift) % 6],
                 id=f"{mode}-{case}-{_M_IDS[(_PATTERN_A + _PATTERN_B)[(i + shift) % 6][0]]}-"
                    f"{'static' if (_PATTERN_A + _PATTERN_B)[(i + shift) % 6][1] else 'dynamic'}"
                    "-batch")
    for mode, shift in _TWO_PASS_MODES.items() for i, case in enumerate(CASES)
    if mode == "second_pass" or case not in _RECURRENT]


# Each mode with each (M, batch kind) once (--extended: every case in both modes); the norms
# come from each handler's default path, which test_handler_update_equals_... covers.
@pytest.mark.cover_each(("mode", "num_microbatches", "static_batch"))
@pytest.mark.parametrize("mode,case,num_microbatches,static_batch", _SECOND_PASS)
def test_two_pass_clipped_sum_equals_per_microbatch_reference(mode, case, num_microbatches,
                                                              static_batch):
    if case in _ONEDNN_ONLY:
        skip_without_onednn_conv_gradients()
    builder, inputs, _, _ = CASES[case]
    x = inputs(num_microbatches or 0)
    y = np.random.default_rng(1).integers(0, 3, BATCH)
    assert_engine_matches_reference(seeded(builder), x, y, num_microbatches=num_microbatches,
                                    static_batch=static_batch,
                                    options=EngineOptions(clipped_sum=mode),
                                    cache_key=("conformance", case, num_microbatches))


def test_two_pass_cases_cover_every_pair():
    for mode in _TWO_PASS_MODES:  # (the recurrent cases' three pairs are in pattern A + B too)
        assert {(m, static) for p in _SECOND_PASS if p.values[0] == mode
                for m, static in [p.values[2:]]} == set(_PATTERN_A + _PATTERN_B), mode


@pytest.mark.skipif(KERAS_MAJOR == 2, reason="the Keras 3 suite runs the oneDNN-only cases")
def test_onednn_only_cases_run_with_onednn_where_this_process_cannot(request):
    """Without oneDNN (e.g. an AVX2-only CPU) TensorFlow cannot differentiate grouped
    convolutions nor dilated transposed ones, so the cases above skip; they then run here in
    a subprocess with TF_ENABLE_ONEDNN_OPTS=1 (each case once, every path of each with
    --extended, and one two-pass run)."""
    if onednn_conv_gradients():
        pytest.skip("this process runs the grouped-convolution cases itself")
    here = pathlib.Path(__file__)
    # Each grouped case once (its first path; every path with --extended), one two-pass run.
    key_size = 2 if extended_run(request.config) else 1
    firsts = {}
    for p in _PARAMS:
        if p.values[0] in _ONEDNN_ONLY:
            firsts.setdefault(p.values[:key_size], p.id)
    ids = [f"{here}::test_handler_update_equals_per_microbatch_reference[{i}]"
           for i in firsts.values()]
    ids += [f"{here}::test_two_pass_clipped_sum_equals_per_microbatch_reference[{p.id}]"
            for p in _SECOND_PASS if p.values[1] in _ONEDNN_ONLY][:1]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids],
                         env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1"), cwd=here.parent.parent,
                         capture_output=True, text=True, timeout=1800, check=False)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    if run.returncode == 0 and "passed" not in summary:
        pytest.skip(f"oneDNN cannot be turned on here either: {summary}")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert f"{len(ids)} passed" in summary, summary


def _trainable_layers(model):
    """The layers that own trainable weights (MultiHeadAttention's are its EinsumDense;
    a recurrent layer owns its cells')."""
    nested = keras_bridge.inside_recurrent_units(model)
    return [layer for layer in keras_bridge.flatten_layers(model)
            if keras_bridge.own_trainable_weights(layer) and id(layer) not in nested]


@pytest.mark.parametrize("case", list(CASES))
def test_each_layer_takes_its_handler(case):
    builder, _, _, expected = CASES[case]
    model = builder("float32")
    names = {}
    for layer in _trainable_layers(model):
        names.setdefault(type(layer).__name__, set()).add(layer_grads.lookup(layer)[0].name)
    assert names == {k: set(v) if isinstance(v, set) else {v} for k, v in expected.items()}


def test_subclass_inheriting_call_keeps_the_handler():
    class Renamed(keras.layers.Dense):
        pass

    layer = Renamed(3)
    layer.build((None, 4))
    assert layer_grads.lookup(layer)[0].name == "dense"
    assert layer_grads.lookup(_DenseWithOwnCall(3))[0] is layer_grads.GENERIC


def test_generic_layers_are_logged_once_per_model(caplog):
    model = make_private(seeded(_generic)("float32"))
    model.compile(optimizer=DPKerasSGDOptimizer(l2_norm_clip=1.0, noise_multiplier=0.0,
                                                learning_rate=0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                  reduction="none"))
    x, y = _floats((6,), 0), np.zeros(BATCH)
    with caplog.at_level(logging.INFO, logger="tf_tempered.privacy.engine"):
        model.fit(x, y, batch_size=BATCH, epochs=2, verbose=0)
        model.fit(x[:8], y[:8], batch_size=8, verbose=0)  # retraced: not logged again
    lines = [r.getMessage() for r in caplog.records if "generic per-layer VJP" in r.getMessage()]
    assert len(lines) == 1
    assert "DenseWithOwnCall" in lines[0]
    # Their own handlers: not logged.
    assert "layer_normalization" not in lines[0] and "tempered_sigmoid" not in lines[0]


@pytest.mark.skipif(KERAS_MAJOR != 3, reason="LoRA, quantization and per-variable trainable "
                    "flags are Keras 3 features")
def test_keras3_variants_take_the_generic_vjp():
    """A handler applies only where its variables are the layer's own trainable weights."""
    conv = keras.layers.Conv2D(3, 3, lora_rank=2)
    conv.build((None, 8, 8, 2))
    quantized = keras.layers.Dense(4)
    quantized.build((None, 6))
    quantized.quantize("int8")
    frozen_kernel = keras.layers.Dense(4)
    frozen_kernel.build((None, 6))
    frozen_kernel.kernel.trainable = False
    for layer in (conv, quantized, frozen_kernel):
        assert layer_grads.lookup(layer)[0] is layer_grads.GENERIC, layer.name
    assert layer_grads.derived_weights(conv).startswith("LoRA")
    assert "int8" in layer_grads.derived_weights(quantized)
    plain = keras.layers.Conv2D(3, 3, strides=(2, 1), padding="SAME")
    plain.build((None, 8, 8, 2))
    handler, params = layer_grads.lookup(plain)
    assert handler.name == "conv2d" and layer_grads.derived_weights(plain) is None
    assert (params.padding, params.strides, params.kernel_size) == ("same", (2, 1), (3, 3))


def test_readme_supported_layers_table_is_generated_from_the_registry():
    readme = (pathlib.Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert layer_grads.supported_layers_markdown() in readme
