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
"""benchmarks/dp_step.py (the README's speed table) still runs and reports every path;
--keras selects the Keras of its process; keras_versions.py's, end_to_end.py's and
summarize.py's medians, ratios and tables; the peers' scripts skip without their framework;
save_weights_cost.py times both saves."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from tf_tempered._compat import KERAS_MAJOR, keras, tensorflow_privacy, tf
from tf_tempered.privacy import layer_paths, make_private

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The last two are TF Privacy's own paths: only where it is installed (Python <= 3.11).
PATHS = ("nonprivate", "tf_tempered", "tf_tempered_tf_ops") + (
    ("dpsequential", "stock_optimizer") if tensorflow_privacy is not None else ())


@pytest.mark.extended  # a whole run of the script; its functions are tested here
def test_dp_step_benchmark_runs_all_paths(tmp_path):
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dp_step.py"), "--batch_size=8", "--steps=1",
         "--rounds=1", "--paths=" + ",".join(PATHS), "--jit_compile",
         f"--json={out}"], check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    # The environment's Keras ran (no --keras), and the result says which.
    assert result["environment"]["keras_major"] == KERAS_MAJOR
    assert result["environment"]["keras_version"] == keras.__version__
    rows = {row["path"]: row for row in result["rows"]}
    assert set(rows) == set(PATHS) | {"nonprivate_xla", "tf_tempered_xla"}
    assert rows["nonprivate"]["time_ratio"] == 1.0
    # The XLA rows: compiled with XLA, against the non-private step compiled the same way.
    assert rows["nonprivate_xla"]["time_ratio"] == 1.0
    assert rows["tf_tempered_xla"]["baseline"] == "nonprivate_xla"
    assert rows["tf_tempered"]["baseline"] == "nonprivate"
    assert all(rows[p]["jit_compile"] for p in ("nonprivate_xla", "tf_tempered_xla"))
    assert "native=False" in rows["tf_tempered_xla"]["layer_paths"][0]["path"]
    for row in rows.values():
        assert row["ms_per_step"] > 0 and row["cpu_ms_per_step"] > 0 and row["peak_bytes"] > 0
    # tf_tempered's paths say which handler and path each layer of the MNIST CNN took.
    for path in ("tf_tempered", "tf_tempered_tf_ops", "tf_tempered_xla"):
        layers = rows[path]["layer_paths"]
        assert [(p["class"], p["handler"]) for p in layers] == [
            ("Conv2D", "conv2d"), ("Conv2D", "conv2d"), ("Dense", "dense"), ("Dense", "dense")]
        assert all(p["path"] for p in layers)
    assert "native=False" in rows["tf_tempered_tf_ops"]["layer_paths"][0]["path"]
    assert "layer_paths" not in rows["nonprivate"]


def _load_module(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.extended  # the whole command in a subprocess; its functions are tested here
def test_dp_step_keras_flag_overrides_the_environment(tmp_path):
    """--keras=<the other Keras> runs that Keras, whatever TF_USE_LEGACY_KERAS says."""
    other = 2 if KERAS_MAJOR == 3 else 3
    out = tmp_path / "result.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dp_step.py"), f"--keras={other}",
         "--batch_size=8", "--steps=1", "--rounds=1", f"--json={out}"],
        check=True, capture_output=True, timeout=600, env=dict(os.environ))
    result = json.loads(out.read_text())
    assert result["environment"]["keras_major"] == other
    assert result["environment"]["keras_module"] == ("keras" if other == 3 else "tf_keras")
    paths = [row["path"] for row in result["rows"]]
    # The default paths: TF Privacy's own (Keras 2 only) are left out on Keras 3.
    if other == 3:
        assert paths == ["nonprivate", "tf_tempered", "tf_tempered_tf_ops"]
        assert result["environment"]["tensorflow_privacy"] is None
    else:
        assert paths[:3] == ["nonprivate", "tf_tempered", "tf_tempered_tf_ops"]


def test_select_keras_sets_and_unsets_the_legacy_switch():
    select_keras = _load_module("dp_step").select_keras
    environ = {"TF_USE_LEGACY_KERAS": "1", "OTHER": "x"}
    assert select_keras(["--model=mnist", "--keras=3"], environ) == 3
    assert environ == {"OTHER": "x"}
    assert select_keras(["--keras", "2"], environ) == 2
    assert environ == {"OTHER": "x", "TF_USE_LEGACY_KERAS": "1"}
    assert select_keras(["--model=mnist"], environ) is None  # the environment decides
    assert environ == {"OTHER": "x", "TF_USE_LEGACY_KERAS": "1"}
    with pytest.raises(SystemExit, match="--keras must be 2 or 3, got '4'"):
        select_keras(["--keras=4"], environ)


def test_keras_versions_summary_is_median_of_process_medians():
    keras_versions = _load_module("keras_versions")
    summarize = keras_versions.summarize
    runs = [{"keras_major": k, "ms_per_step": {"tf_tempered": ms}, "cpu_ms_per_step": {"tf_tempered": 2 * ms}}
            for k, ms in [(3, 10.0), (2, 8.0), (3, 30.0), (2, 9.0), (3, 11.0), (2, 100.0)]]
    summary = summarize(runs, ["tf_tempered"])
    assert summary[3]["tf_tempered"]["ms_per_step"] == 11.0
    assert summary[2]["tf_tempered"]["ms_per_step"] == 9.0
    assert summary[3]["tf_tempered"]["cpu_ms_per_step"] == 22.0
    assert summary[3]["tf_tempered"]["process_medians"] == [10.0, 30.0, 11.0]
    assert summary[2]["tf_tempered"]["process_medians"] == [8.0, 9.0, 100.0]
    # Pairs in the order they ran: (10, 8), (30, 9), (11, 100).
    assert keras_versions.paired_ratios(runs, "tf_tempered") == [10.0 / 8.0, 30.0 / 9.0, 11.0 / 100.0]


def test_keras_versions_report_from_saved_runs():
    keras_versions = _load_module("keras_versions")
    env = {"keras_version": "v", "keras_module": "m", "tensorflow": "t", "python": "p", "cpus": 2}
    runs = [{"keras_major": k, "ms_per_step": {"nonprivate": np_ms, "tf_tempered": dp_ms},
             "cpu_ms_per_step": {"nonprivate": np_ms, "tf_tempered": dp_ms}}
            for k, np_ms, dp_ms in [(3, 10.0, 12.0), (2, 10.0, 11.0), (3, 20.0, 30.0),
                                    (2, 20.0, 22.0), (3, 10.0, 13.0), (2, 10.0, 12.0)]]
    assert keras_versions.within_process_ratios(runs, 3, "tf_tempered") == [1.2, 1.5, 1.3]
    paths = ["nonprivate", "tf_tempered"]
    result = {"args": {"model": "mnist", "batch_size": 256, "processes": 3, "rounds": 5, "steps": 10},
              "load_average_before": [1.0, 2.0, 3.0], "load_average_after": None,
              "versions": {"3": env, "2": env}, "rows": keras_versions.table_rows(runs, paths),
              "runs": runs}
    tf_tempered_row = result["rows"][1]
    assert tf_tempered_row["keras3_ms_per_step"] == 13.0 and tf_tempered_row["keras2_ms_per_step"] == 12.0
    assert tf_tempered_row["keras3_over_keras2"] == 13.0 / 12.0
    report = keras_versions.render(result)
    assert "| tf_tempered | 13.0 | 12.0 | 1.08 |" in report
    assert "before 1.00/2.00/3.00, after n/a" in report
    assert "on Keras 3, within each process (interleaved there): median 1.30 (1.20 1.50 1.30)" in report


def _dp_step_result(model, rows, **args):
    env = {"keras_major": 3, "keras_version": "3.x", "tensorflow": "2.x", "python": "3.y",
           "load_average_before": [1.0, 1.5, 2.0]}
    return {"args": dict({"model": model, "batch_size": 256, "paths": "nonprivate,tf_tempered",
                          "steps": 10, "rounds": 5, "keras": "3", "dynamic_batch": False,
                          "jit_compile": False, "stock_steps": 1}, **args),
            "environment": env, "rows": rows}


def test_summary_table_has_every_row_its_command_and_layer_paths(tmp_path):
    summarize = _load_module("summarize")
    row = {"path": "tf_tempered", "ms_per_step": 13.2, "cpu_ms_per_step": 20.0,
           "peak_bytes": 3 * 2**20, "time_ratio": 1.2, "cpu_ratio": 1.25, "memory_ratio": 1.5,
           "layer_paths": [{"layer": "conv1", "handler": "conv2d", "path": "ConvPath(...)"}]}
    base = {"path": "nonprivate", "ms_per_step": 11.0, "cpu_ms_per_step": 16.0,
            "peak_bytes": 2 * 2**20, "time_ratio": 1.0, "cpu_ratio": 1.0, "memory_ratio": 1.0}
    path = tmp_path / "cifar10_b256.json"
    path.write_text(json.dumps(_dp_step_result("cifar10", [base, row], dynamic_batch=True)))
    report = summarize.summarize([str(path)])
    assert "| cifar10 | 256 (dynamic) | 3 | tf_tempered | 13.2 | 1.20 | 1.25 | 3 | 1.50 | cifar10_b256 |" in report
    assert "| cifar10 | 256 (dynamic) | 3 | nonprivate | 11.0 | 1.00 | 1.00 | 2 | 1.00 |" in report
    # Flags at their defaults are left out of the command; the others are kept.
    assert (f"`python benchmarks/dp_step.py --keras=3 --model=cifar10 --batch_size=256 "
            f"--paths=nonprivate,tf_tempered --rounds=5 --dynamic_batch --json={path}`") in report
    assert "- tf_tempered: conv1 conv2d: ConvPath(...)" in report


def test_end_to_end_ratios_are_medians_of_pairs():
    end_to_end = _load_module("end_to_end")
    pairs = [{"dp": {"process_s": dp, "script_s": dp - 5, "test_accuracy": 0.9, "epsilon": 1.0},
              "nonprivate": {"process_s": npv, "script_s": npv - 5, "test_accuracy": 0.95,
                             "epsilon": None}, "first": first}
             for dp, npv, first in [(12.0, 10.0, "dp"), (30.0, 20.0, "nonprivate"), (11.0, 10.0, "dp")]]
    summary = end_to_end.summarize(pairs)
    assert summary["process_s"] == {"dp": 12.0, "nonprivate": 10.0, "ratio": 1.2}
    assert summary["script_s"]["ratio"] == pytest.approx(7.0 / 5.0)
    report = end_to_end.render({"train_args": "--dataset=digits", "pairs": pairs,
                                "environment": "env", "load_before": "1", "load_after": "2"})
    assert "| whole process | 12.0 | 10.0 | 1.20 |" in report
    assert "| 2 | nonprivate | 30.0 | 20.0 | 1.50 | 0.9000 | 0.9500 | 1 |" in report


def test_train_step_times_splits_padding_from_engine():
    step_times = _load_module("train_step_times")
    def run(ms, rows):
        return {"median_step_ms": ms, "first_batch_s": 1.0, "batch_rows": rows}
    runs = {"dp_poisson": [run(18.0, 380), run(17.0, 380)],
            "dp_shuffle": [run(12.0, 256), run(11.0, 256)],
            "dp_poisson_unpadded": [run(11.5, 256), run(11.5, 256)],
            "nonprivate": [run(10.0, 256), run(11.0, 256)]}
    report = step_times.render({"train_args": "--dataset=mnist", "runs": runs,
                                "environment": "env", "load_before": "1", "load_after": "2"})
    assert "| dp_poisson | 17.50 (18.00, 17.00) | 1.67 | 1.00, 1.00 | 380 |" in report
    assert "Padding (dp_poisson / dp_shuffle): 1.52; engine at the same batch " \
        "(dp_shuffle / nonprivate): 1.10. Unpadded Poisson batches (dp_poisson_unpadded / " \
        "nonprivate): 1.10." in report


@pytest.mark.parametrize("script,package", [("opacus_step.py", "torch"), ("jax_step.py", "jax")])
def test_peer_scripts_skip_without_their_framework(script, package):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peers" / script),
                             "--model=mnist"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert f"skipped: {package} not installed (pip install -e .[peers])" in result.stdout


@pytest.mark.parametrize("jit_compile", [
    False, pytest.param(True, marks=pytest.mark.keras3_suite)], ids=["executor", "xla"])
def test_conv1_tf_ops_formulations_give_the_engines_norms(jit_compile):
    """benchmarks/conv1_tf_ops.py times formulations of the same per-example norms: they must
    agree with the engine's (and with a per-example filter gradient), or the timing compares
    different work. At 8 examples (the formulations read the module's BATCH when traced): the
    same shapes per example (measured: 3.6 against 21.7 s under XLA)."""
    bench = _load_module("conv1_tf_ops")
    bench.BATCH = 8
    layer = bench._layer()
    x = tf.random.normal([bench.BATCH, bench.SIZE, bench.SIZE, 1], seed=3)
    g = tf.random.normal([bench.BATCH, bench.OUT, bench.OUT, bench.FILTERS], seed=4)
    first = [tf.compat.v1.nn.conv2d_backprop_filter(
        x[i:i + 1], [8, 8, 1, 16], g[i:i + 1], strides=[1, 2, 2, 1], padding="SAME")
        for i in range(3)]
    direct = np.array([float(tf.reduce_sum(tf.square(f))) for f in first])
    formulations = bench.formulations(layer, jit_compile)
    assert ("offsets" in formulations) == jit_compile
    for name, fn in formulations.items():
        np.testing.assert_allclose(fn(x, g).numpy()[:3], direct, rtol=1e-4, err_msg=name)


def test_tf_ops_conv_paths_forces_conv2_s_path_while_tracing_only():
    bench = _load_module("tf_ops_conv_paths")
    data = _load_module("dp_step")._dataset("mnist", 8)  # pylint: disable=protected-access
    model = bench._model("conv2_materialized_by_offsets", data)
    paths = {p["layer"]: p["path"] for p in layer_paths(model)}
    assert "materialize=True, kept_by='offsets'" in paths["conv2"]
    assert "native=False" in paths["conv1"] and "native=False" in paths["conv2"]
    assert bench.conv.choose_path is bench._CHOOSE  # restored for the next variant


def test_dp_step_dynamic_batch_pipeline_trains_a_private_model():
    # run_all.sh stopped at its --dynamic_batch rows: the pipeline repeated one batch before
    # an unbatch, which fit refuses (an example's share of a batch unbounded). Batched first.
    data = _load_module("dp_step")._dataset("mnist", 8, dynamic_batch=True)  # pylint: disable=protected-access
    assert data.element_spec[0].shape.as_list() == [None, 28, 28, 1]
    model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                              keras.layers.Dense(10)])
    make_private(model, l2_norm_clip=1.0, noise_multiplier=1.0)
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with pytest.warns(UserWarning, match="accounted with the bound for shuffled batches"):
        history = model.fit(data, steps_per_epoch=2, epochs=1, verbose=0)
    assert history.history["epsilon"][0] > 0


def test_dp_step_ratios_are_against_the_step_compiled_the_same_way():
    baselines = _load_module("dp_step").baselines
    both = ["nonprivate", "tf_tempered", "nonprivate_xla", "tf_tempered_xla"]
    assert baselines(both, both) == {"nonprivate": "nonprivate", "tf_tempered": "nonprivate",
                                     "nonprivate_xla": "nonprivate_xla",
                                     "tf_tempered_xla": "nonprivate_xla"}
    # XLA rows only (the A/B runs of an XLA path): their ratios still come out.
    xla_only = ["nonprivate_xla", "tf_tempered_xla"]
    assert baselines(xla_only, xla_only) == {"nonprivate_xla": "nonprivate_xla",
                                             "tf_tempered_xla": "nonprivate_xla"}
    # Never an XLA row against the step without XLA (nor the reverse): no ratio instead.
    assert baselines(["nonprivate", "tf_tempered_xla"], ["nonprivate", "tf_tempered_xla"]) == {
        "nonprivate": "nonprivate", "tf_tempered_xla": None}


def test_interleaved_times_every_variant_each_round_and_reports_ratios(capsys):
    interleaved = _load_module("interleaved")
    calls = []
    steps = {"base": lambda d: calls.append(("base", d)),
             "other": lambda d: calls.append(("other", d))}
    times = interleaved.time_rounds(steps, "batch", rounds=3, calls=2)
    assert [len(v) for v in times.values()] == [3, 3]
    # Rounds alternate the variants: base twice, other twice, base twice...
    assert [name for name, _ in calls] == (["base"] * 2 + ["other"] * 2) * 3
    assert all(d == "batch" for _, d in calls)
    interleaved.report({"base": [1.0, 2.0, 3.0], "other": [2.0, 4.0, 6.0], "third": [1.0, 1.0, 3.0]})
    out = capsys.readouterr().out
    assert "other        median 4.00 ms  x2.000 of base" in out
    assert "third/other per-round median 0.500" in out


def test_save_weights_cost_times_both_saves_of_one_private_model():
    with_dp, weights_only, ratio = _load_module("save_weights_cost").measure(rounds=2)
    assert with_dp > 0 and weights_only > 0
    assert ratio == pytest.approx(with_dp / weights_only)


def test_eager_checks_times_each_variant_and_restores_the_engine(monkeypatch):
    from tf_tempered.privacy.step import eager_passes  # pylint: disable=import-outside-toplevel
    eager_checks = _load_module("eager_checks")
    monkeypatch.setattr(eager_checks, "STEPS", 2)
    calls = []
    real = eager_passes.traced_passes
    monkeypatch.setattr(eager_passes, "traced_passes",
                        lambda *args: calls.append(1) or real(*args))
    counted = eager_passes.traced_passes
    for variant, traced in (("traced_each_step", 4), ("eager_unchecked", 0), ("traced_once", 0)):
        del calls[:]
        assert eager_checks._fit_time("mlp", variant) > 0  # pylint: disable=protected-access
        assert len(calls) == traced  # 2 warm-up steps and 2 timed, each traced
        assert eager_passes.traced_passes is counted