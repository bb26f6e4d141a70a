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
"""The native per-group Conv2D kernel gradient op against per-example tapes, and its build.

The reference is the gradient of Σ conv(x_e)·g_e w.r.t. a real Conv2D's kernel,
one tape per example e, summed over each group of consecutive examples.
"""

import ast
import ctypes
import logging
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from conv_op_cases import CASES as _CASES, RTOL as _RTOL, case_id as _case_id
from conv_op_cases import reference as _reference, setup as _setup

from tf_tempered.privacy import errors
from tf_tempered._compat import tf
from tf_tempered.privacy import native as native_ops
from tf_tempered.privacy.layer_grads import conv_grads
from tf_tempered.privacy.native import library as native

# Without a compiler the op cannot exist: skip. With one, a failed build fails.
needs_op = pytest.mark.skipif(native._compiler() is None,
                              reason="no C++ compiler ($CXX, c++, g++, clang++) to build the op")

def _kernel_grads(layer, x, g, num_groups, output_grads, bias_grads=False):
    return native_ops.conv2d_group_kernel_grads(
        x, g, num_groups, kernel_size=layer.kernel_size, strides=layer.strides,
        dilations=layer.dilation_rate, pads=conv_grads.padding_before(layer, x),
        output_grads=output_grads, bias_grads=bias_grads)


@pytest.fixture
def op(monkeypatch):
    """A fresh load of the op; with TF_TEMPERED_NATIVE=1 a failed build raises, not falls back."""
    monkeypatch.setenv("TF_TEMPERED_NATIVE", "1")
    monkeypatch.setitem(native._state, "loaded", False)
    monkeypatch.setitem(native._state, "module", None)
    assert native.available()


@needs_op
@pytest.mark.parametrize("output_grads", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", _CASES, ids=_case_id)
def test_group_kernel_grads_equal_per_example_tapes(op, case, dtype, output_grads):
    layer, x, g, groups = _setup(case, dtype)
    # The bias's sums with and without the kept kernel gradients: all four pairs over the dtypes.
    bias_grads = output_grads == (dtype == "float32")
    sq_norms, grads, bias = _kernel_grads(layer, x, g, groups, output_grads, bias_grads)
    reference = _reference(layer, x, g, groups)
    cout = g.shape[-1]
    if bias_grads:
        expected_bias = g.numpy().reshape(groups, -1, cout).sum(axis=1)
        assert bias.shape == (groups, cout) and bias.dtype == tf.as_dtype(dtype)
        np.testing.assert_allclose(bias.numpy(), expected_bias, rtol=_RTOL[dtype],
                                   atol=_RTOL[dtype] * np.abs(expected_bias).max())
    else:
        assert bias.shape == (0, cout)
    size = int(np.prod(layer.kernel.shape))
    assert reference.shape == (groups, size)
    assert sq_norms.dtype == grads.dtype == tf.as_dtype(dtype)
    scale = np.abs(reference).max()
    assert scale > 0
    if output_grads:
        assert grads.shape == (groups, size)
        error = np.abs(grads.numpy() - reference).max()
        assert error <= _RTOL[dtype] * scale, (error, scale)
    else:
        assert grads.shape == (0, size)
    expected_sq = np.square(reference.astype(np.float64)).sum(axis=1)
    assert sq_norms.shape == (groups,)
    np.testing.assert_allclose(sq_norms.numpy(), expected_sq, rtol=2 * _RTOL[dtype])


@needs_op
def test_group_kernel_grads_in_tf_function(op):
    layer, x, g, groups = _setup(_CASES[3], "float32", seed=1)
    size = int(np.prod(layer.kernel.shape))
    fn = tf.function(lambda x, g: _kernel_grads(layer, x, g, groups, True, bias_grads=True))
    sq_norms, grads, bias = fn(x, g)
    reference = _reference(layer, x, g, groups)
    graph_out = fn.get_concrete_function(x, g).structured_outputs
    assert graph_out[1].shape.as_list() == [None, size]
    assert graph_out[2].shape.as_list() == [None, g.shape[-1]]
    np.testing.assert_allclose(bias.numpy(), g.numpy().reshape(groups, -1, g.shape[-1]).sum(1),
                               rtol=1e-5, atol=1e-5)
    assert np.abs(grads.numpy() - reference).max() <= 1e-5 * np.abs(reference).max()
    np.testing.assert_allclose(sq_norms.numpy(), np.square(reference).sum(axis=1), rtol=2e-5)


@needs_op
def test_float32_layer_takes_float64_input(op):
    # x is cast to g's dtype: a float64 input with a float32 output gradient computes in float32.
    layer, x, g, groups = _setup(_CASES[1], "float32", seed=2)
    sq_norms, grads, _ = _kernel_grads(layer, tf.cast(x, tf.float64), g, groups, True)
    reference = _reference(layer, x, g, groups)
    assert grads.dtype == tf.float32
    assert np.abs(grads.numpy() - reference).max() <= 1e-5 * np.abs(reference).max()


@needs_op
@pytest.mark.parametrize("batch,num_groups", [(10, 3), (4, 0), (3, 6)])
def test_batch_not_divisible_by_num_groups_is_rejected(op, batch, num_groups):
    layer, x, g, _ = _setup(("same", 3, 1, 1, (5, 5), 2, 4, batch, 1), "float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_groups"):
        _kernel_grads(layer, x, g, num_groups, True)


@needs_op
def test_non_scalar_num_groups_is_rejected(op):
    layer, x, g, _ = _setup(("same", 3, 1, 1, (5, 5), 2, 4, 4, 1), "float32")
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_groups must be a scalar"):
        native.load().tf_tempered_conv2d_group_kernel_grads(
            x, g, tf.constant([2, 2]), kernel_size=[3, 3], strides=[1, 1], dilations=[1, 1],
            pads=[1, 1], output_grads=False)


@needs_op
def test_build_returns_the_cached_library():
    path = native.build()
    assert path.exists() and path == native.library_path()
    assert native.build() == path  # cached: no rebuild


def test_library_path_follows_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path / "a"))
    first = native.library_path()
    assert first.parent == tmp_path / "a"
    assert first.name.startswith("native_ops-") and first.suffix == ".so"
    monkeypatch.setenv("TF_TEMPERED_CACHE_DIR", str(tmp_path / "b"))
    assert native.library_path() == tmp_path / "b" / first.name
    monkeypatch.delenv("TF_TEMPERED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert native.library_path() == tmp_path / "xdg" / "tf_tempered" / first.name
    assert not any(tmp_path.iterdir())  # only paths, nothing built


@pytest.fixture
def failing_build(monkeypatch, tmp_path):
    """No compiler and no cached library: build() must fail."""
    missing = tmp_path / "cache" / "native_ops-missing.so"
    monkeypatch.setattr(native, "_compiler", lambda: None)
    monkeypatch.setattr(native, "library_path", lambda: missing)
    return missing


def test_build_without_compiler_says_how_to_fix(failing_build):
    with pytest.raises(errors.NativeBuildError) as info:
        native.build()
    message = str(info.value)
    assert "no C++ compiler" in message and "install" in message
    assert "TF_TEMPERED_NATIVE=0" in message
    assert not failing_build.parent.exists()


def _sources(tmp_path, texts):
    paths = []
    for name, text in texts.items():
        paths.append(tmp_path / name)
        paths[-1].write_text(text)
    return tuple(paths)


@needs_op
def test_build_compiles_each_source_and_links_them_into_one_library(monkeypatch, tmp_path):
    """The sources compile to one object each (several compilers at once), linked into one
    library that holds every source's functions."""
    monkeypatch.setattr(native, "_SOURCES", _sources(tmp_path, {
        "one.cc": 'extern "C" int tf_tempered_one() { return 1; }\n',
        "two.cc": 'extern "C" int tf_tempered_two() { return 2; }\n'}))
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "cache" / "native_ops-t.so")
    library = ctypes.CDLL(str(native.build()))
    assert (library.tf_tempered_one(), library.tf_tempered_two()) == (1, 2)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "native_ops-t.lock", "native_ops-t.so"]  # no object file left behind


@needs_op
def test_a_source_that_fails_to_compile_is_named_with_the_compiler_s_error(monkeypatch, tmp_path):
    monkeypatch.setattr(native, "_SOURCES", _sources(tmp_path, {
        "good.cc": 'extern "C" int tf_tempered_good() { return 1; }\n',
        "broken.cc": "int broken( { return 1; }\n"}))
    monkeypatch.setattr(native, "library_path", lambda: tmp_path / "cache" / "native_ops-t.so")
    with pytest.raises(errors.NativeBuildError) as info:
        native.build()
    message = str(info.value)
    assert "compiling broken.cc failed" in message and "error" in message
    assert "good.cc failed" not in message
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["native_ops-t.lock"]


@pytest.fixture
def fresh_state(monkeypatch):
    monkeypatch.setitem(native._state, "loaded", False)
    monkeypatch.setitem(native._state, "module", None)


def test_switch_off_builds_nothing(monkeypatch, fresh_state, failing_build):
    monkeypatch.setenv("TF_TEMPERED_NATIVE", "0")
    monkeypatch.setattr(native, "build", lambda: pytest.fail("build() called with the switch off"))
    assert native.available() is False
    assert native._state == {"loaded": True, "module": None}


def test_switch_on_makes_a_failed_build_an_error(monkeypatch, fresh_state, failing_build):
    monkeypatch.setenv("TF_TEMPERED_NATIVE", "1")
    with pytest.raises(errors.NativeBuildError, match="TF_TEMPERED_NATIVE=1.*no C\\+\\+ compiler"):
        native.available()
    assert native._state["loaded"] is False  # a later call tries again


def test_switch_unset_falls_back_with_a_warning(monkeypatch, caplog, fresh_state, failing_build):
    monkeypatch.delenv("TF_TEMPERED_NATIVE", raising=False)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.available() is False
        assert native.available() is False  # cached: warned once
    warnings = [r for r in caplog.records if r.name == native.__name__]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "using TF ops" in warnings[0].getMessage()
    assert "no C++ compiler" in warnings[0].getMessage()


@needs_op
def test_main_builds_and_reports(capsys):
    assert native.main() == 0
    out = capsys.readouterr().out
    assert "native op ready" in out and str(native.build()) in out


def test_the_package_imports_nothing_of_the_engine():
    """privacy/native is the engine's lowest layer: the handlers and the noise stage import
    it, it imports only the Keras selection and the error types."""
    package = pathlib.Path(native.__file__).parent
    imported = set()
    for source in package.glob("*.py"):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    ours = {name for name in imported if name.split(".")[0] == "tf_tempered"
            and not name.startswith("tf_tempered.privacy.native")}
    assert ours == {"tf_tempered._compat", "tf_tempered.privacy.errors"}, ours


@pytest.mark.keras3_suite  # the native op alone: the same on either Keras
def test_module_command_runs(tmp_path):
    """``python -m tf_tempered.privacy.native`` (docs/install.md) reports either way."""
    env = {**os.environ, "TF_TEMPERED_NATIVE": "0"}
    result = subprocess.run([sys.executable, "-m", "tf_tempered.privacy.native"], env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode in (0, 1), result.stderr[-2000:]
    assert ("native op ready" in result.stdout) == (result.returncode == 0), result.stdout


def test_library_path_follows_the_headers_too(monkeypatch, tmp_path):
    """An edit of cc/philox.h (included by box_muller.cc) must rebuild, as one of a source."""
    header = tmp_path / "philox.h"
    header.write_text("// one", encoding="utf-8")
    monkeypatch.setattr(native, "_HEADERS", (header,))
    first = native.library_path()
    header.write_text("// two", encoding="utf-8")
    assert native.library_path() != first


def test_every_source_and_header_ships():
    """setup.cfg's package data and the build's inputs cover every file in cc/."""
    cc = pathlib.Path(native.__file__).with_name("cc")
    assert {p.name for p in cc.iterdir() if p.suffix in (".cc", ".h")} == \
        {p.name for p in native._SOURCES + native._HEADERS}  # pylint: disable=protected-access
    setup_cfg = (pathlib.Path(__file__).resolve().parents[1] / "setup.cfg").read_text()
    assert "tf_tempered.privacy.native = cc/*.cc, cc/*.h" in setup_cfg
