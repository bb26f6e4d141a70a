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
"""The Colab tutorials in tutorials/: committed clean, and they run top to bottom.

Each notebook is executed in memory with nbclient, in a fresh kernel of THIS
interpreter (a kernel spec written to tmp_path, so a "python3" kernel registered
elsewhere on the machine cannot substitute another Python), with tmp_path as the
working directory; a cell that raises fails the test with the cell's traceback.
Nothing is written back into tutorials/. When MNIST's files are beside the
checkout (../shared/data), they are offered to the notebooks through
$TF_TEMPERED_DATA_DIR; otherwise the notebooks fall back to scikit-learn's digits.
The notebooks show Keras 3 (`import keras`); with TF_USE_LEGACY_KERAS=1 (Keras 2, as
their text tells TF Privacy users) they run with `import tf_keras as keras` instead.

The static checks need only the JSON: no outputs or execution counts are
committed, every notebook has a title, its own "Open in Colab" badge and the
same install cell, which is skipped when tf_tempered is importable, pip-installs
it on Python 3.10-3.13 and refuses newer Pythons unless told to try (its branches
run here with pip mocked), tf_tempered is imported first, and the code uses Keras 3's
public API (`import keras`, reduction="none", no tf.keras).
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from tf_tempered._compat import legacy_keras_requested

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
TUTORIALS = REPO_ROOT / "tutorials"
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
NOTEBOOKS = ("01_quickstart", "02_why_bounded_activations", "03_reproducing_mnist",
             "04_choosing_epsilon", "05_auditing", "06_lora_finetuning")
# Keras 3 only (LoRA: Keras 2 layers have no enable_lora); their imports cell says so and stops.
KERAS3_ONLY = ("06_lora_finetuning",)
COLAB_URL = "https://colab.research.google.com/github/tf-tempered/tf_tempered/blob/main/tutorials/"
CELL_TIMEOUT_S = 300
KERNEL_NAME = "tf_tempered_tutorials"

pytestmark = pytest.mark.skipif(
    not TUTORIALS.is_dir(),
    reason=f"{TUTORIALS} is not here (e.g. a Bazel sandbox without the notebooks as data)")


def _load(name):
    path = TUTORIALS / f"{name}.ipynb"
    assert path.is_file(), f"{path} is missing"
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _source(cell):
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _code_cells(notebook):
    return [_source(c) for c in notebook["cells"] if c["cell_type"] == "code"]


def test_tutorials_folder_holds_exactly_the_tutorials():
    """No executed copies or stray notebooks beside NOTEBOOKS (update it when adding one)."""
    found = sorted(p.stem for p in TUTORIALS.glob("*.ipynb"))
    assert found == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    notebook = _load(name)
    assert notebook["nbformat"] == 4
    dirty = [i for i, cell in enumerate(notebook["cells"]) if cell["cell_type"] == "code"
             and (cell.get("outputs") or cell.get("execution_count") is not None)]
    assert not dirty, (f"{name}.ipynb: code cells {dirty} carry outputs or execution counts; "
                       f"commit notebooks with outputs stripped (e.g. `jupyter nbconvert "
                       f"--clear-output --inplace tutorials/{name}.ipynb`).")


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_title_badge_and_install_cell(name):
    notebook = _load(name)
    first = _source(notebook["cells"][0])
    assert notebook["cells"][0]["cell_type"] == "markdown" and first.startswith("# ")
    assert f"]({COLAB_URL}{name}.ipynb)" in first, (
        "the Open in Colab badge must link to this notebook")
    assert "colab-badge.svg" in first

    code = _code_cells(notebook)
    install = code[0]
    assert '"pip", "install"' in install, "the first code cell installs tf_tempered with pip"
    assert 'find_spec("tf_tempered") is None' in install, (
        "the install cell must be skipped when tf_tempered is already importable")
    assert "%pip" not in install and "!pip" not in install, (
        "IPython magics do not run inside an if block; call pip through subprocess")
    assert "(3, 14)" in install, "the install cell must state the Python version limit"


def test_install_cells_are_identical():
    cells = {name: _code_cells(_load(name))[0] for name in NOTEBOOKS}
    assert len(set(cells.values())) == 1, "keep one install cell, the same in every notebook"


@pytest.mark.parametrize("version, try_unsupported, expected", [
    ((3, 10, 13), False, "install"),
    ((3, 11, 9), False, "install"),
    ((3, 12, 3), False, "install"),  # Colab: without TF Privacy, with our DP optimizers
    ((3, 13, 0), False, "install"),
    ((3, 14, 0), False, "refuse"),
    ((3, 14, 0), True, "install --ignore-requires-python"),
])
def test_install_cell_branches(monkeypatch, version, try_unsupported, expected):
    """Where tf_tempered is missing: pip install on 3.10-3.13, refuse or force on 3.14+."""
    source = _code_cells(_load(NOTEBOOKS[0]))[0]
    if try_unsupported:
        source = source.replace("TRY_UNSUPPORTED_PYTHON = False", "TRY_UNSUPPORTED_PYTHON = True")
    calls = []
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args, **kwargs: None)
    monkeypatch.setattr(subprocess, "check_call", lambda command, **kwargs: calls.append(command))
    monkeypatch.setattr(sys, "version_info", version)
    run = lambda: exec(compile(source, "install cell", "exec"), {})  # noqa: E731
    if expected == "refuse":
        with pytest.raises(RuntimeError, match="Python 3.10 to 3.13"):
            run()
        assert not calls
        return
    run()
    (command,) = calls
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert any(arg.startswith("tf_tempered @ git+https://github.com/") for arg in command)
    assert ("--ignore-requires-python" in command) == try_unsupported


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_tf_tempered_is_imported_before_tensorflow(name):
    code = _code_cells(_load(name))
    imports = re.compile(r"^\s*(?:import|from)\s+(tf_tempered|tensorflow\b|tensorflow_privacy)",
                         re.MULTILINE)
    order = [m.group(1) for cell in code[1:] for m in imports.finditer(cell)]
    assert order and order[0] == "tf_tempered", (
        f"{name}.ipynb imports {order[:1]} first; keep the notebooks' one convention: "
        f"`import tf_tempered` first")
    assert code[1].lstrip().startswith("import tf_tempered"), (
        "the first code cell after the install cell should start with `import tf_tempered`")


# The one line a Keras 2 user changes (with TF_USE_LEGACY_KERAS=1), as the notebooks say.
KERAS3_IMPORT = (
    "import keras  # Keras 3; Keras 2 (TF_USE_LEGACY_KERAS=1): import tf_keras as keras\n")
KERAS2_IMPORT = "import tf_keras as keras\n"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebooks_show_the_keras3_public_api(name):
    """Keras 3 the standard way: `import keras`, losses as compiled, no tf.keras, no internals."""
    notebook = _load(name)
    code = "\n".join(_code_cells(notebook)[1:])
    text = "\n".join(_source(c) for c in notebook["cells"])
    for old in ("tf.keras", "Reduction.NONE", "tf_tempered._compat", "keras.optimizers.legacy",
                "tensorflow_privacy", "TF_USE_LEGACY_KERAS\"] = "):
        assert old not in code, f"{name}.ipynb runs {old!r}; show the Keras 3 public API"
    uses_keras = re.search(r"\bkeras\.", code) is not None
    assert code.count(KERAS3_IMPORT) == (1 if uses_keras else 0), (
        f"{name}.ipynb: import Keras once, in the imports cell, as {KERAS3_IMPORT.strip()!r}")
    # A private model takes the loss as users compile it (no reduction="none" needed).
    assert 'reduction="none"' not in code, f"{name}.ipynb: compile losses as users do"
    # Where the imports are explained: Keras 3 by default, Keras 2 for TF Privacy users.
    assert "TF_USE_LEGACY_KERAS=1" in text and "import tf_keras as keras" in text


def _kernel_manager(tmp_path):
    """An AsyncKernelManager whose only kernel spec runs ipykernel in this interpreter."""
    from jupyter_client import AsyncKernelManager  # pylint: disable=g-import-not-at-top
    from jupyter_client.kernelspec import KernelSpecManager  # pylint: disable=g-import-not-at-top

    spec_dir = tmp_path / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"Python {sys.version_info.major}.{sys.version_info.minor} (tests)",
        "language": "python",
    }), encoding="utf-8")
    specs = KernelSpecManager(kernel_dirs=[str(spec_dir.parent)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name=KERNEL_NAME, kernel_spec_manager=specs)


# The quickstart on Keras 2 (on Keras 3 tests/test_readme_quickstart.py runs the same steps);
# every notebook with --extended (tests/conftest.py): the code they show runs in the tests of
# its modules, and test_notebooks_* check their text. KERAS3_ONLY ones are skipped on Keras 2.
def _run_param(name):
    if legacy_keras_requested() and name in KERAS3_ONLY:
        return pytest.param(name, marks=pytest.mark.skip(
            reason=f"{name}.ipynb needs Keras 3 (its imports cell stops on Keras 2)"))
    if name == "01_quickstart" and legacy_keras_requested():
        return name
    return pytest.param(name, marks=pytest.mark.extended)


@pytest.mark.parametrize("name", [_run_param(name) for name in NOTEBOOKS])
def test_runs_top_to_bottom(name, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")

    notebook = nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4)
    nbformat.validate(notebook)
    if legacy_keras_requested():
        # TF_USE_LEGACY_KERAS=1 (inherited by the kernel): run the notebook as its imports
        # cell tells Keras 2 users to, with `import tf_keras as keras`.
        for cell in notebook.cells:
            if cell.cell_type == "code":
                cell.source = cell.source.replace(KERAS3_IMPORT, KERAS2_IMPORT)
    if (SHARED_DATA / "mnist").is_dir() and not os.environ.get("TF_TEMPERED_DATA_DIR"):
        monkeypatch.setenv("TF_TEMPERED_DATA_DIR", str(SHARED_DATA))
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    work_dir = tmp_path / "work"
    work_dir.mkdir()
    client = nbclient.NotebookClient(
        notebook, km=_kernel_manager(tmp_path), kernel_name=KERNEL_NAME,
        timeout=CELL_TIMEOUT_S, allow_errors=False,
        resources={"metadata": {"path": str(work_dir)}})
    start = time.monotonic()
    client.execute()  # raises CellExecutionError (with the cell and traceback) on failure
    print(f"{name}.ipynb ran in {time.monotonic() - start:.1f} s")

    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "every code cell must run"
    install_output = "".join(o.get("text", "") for o in code[0].outputs)
    assert "already installed" in install_output, "the test must not pip install anything"
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors
