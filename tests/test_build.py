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
"""Checks that the top-level Bazel BUILD file covers every module and test file.

Bazel itself is not needed: the BUILD file's Starlark (calls, lists, list
comprehensions, string formatting) is also valid Python, so it is evaluated here
with stand-ins for the rules that record each target, and a glob() that follows
Bazel's rules (`**` spans any number of directories, `*` stays within one, the
search stops at directories holding their own BUILD file). The recorded targets
are then checked against the files on disk: every tf_tempered/**/*.py must be in
a py_library, every tests/test_*.py must have its own py_test, and every file a
target names must exist.

The same goes for setup.cfg's install_requires: every third-party module that
tf_tempered/**/*.py imports (at any depth, also inside functions) must be a
declared requirement, so that a fresh `pip install` runs every module.
"""

import ast
import builtins
import configparser
import os
import pathlib
import re
import shutil
import sys

import pytest

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
BUILD_FILE_NAMES = ("BUILD", "BUILD.bazel")
PACKAGE_DIR = "tf_tempered"
TESTS_DIR = "tests"
CONFTEST = "tests/conftest.py"
SKIP_DIRS = {"__pycache__", ".git"}

LICENSE_HEADER = (REPO_ROOT / "tf_tempered" / "version.py").read_text(
    encoding="utf-8").splitlines()[:13]

_PY_RULES = ("py_library", "py_binary", "py_test")
_RECORDED_RULES = _PY_RULES + ("genrule", "filegroup", "alias", "sh_binary", "sh_test")
_IGNORED_CALLS = ("package", "licenses", "exports_files", "load", "workspace")
# Builtins a BUILD file may use (a subset of Starlark's; `fail` is added below).
_SAFE_BUILTINS = {name: getattr(builtins, name)
                  for name in ("all", "any", "bool", "dict", "enumerate", "getattr", "hasattr",
                               "int", "len", "list", "max", "min", "print", "range", "reversed",
                               "sorted", "str", "tuple", "type", "zip")}


class BuildError(Exception):
    """The BUILD file cannot be evaluated."""


def _fail(*args):
    raise BuildError(" ".join(str(a) for a in args))


# --------------------------------------------------------------------------- glob


def _glob_regex(pattern):
    """A regex for one Bazel glob pattern (relative to the package directory)."""
    if pattern.startswith("/") or pattern.endswith("/") or "//" in pattern:
        raise BuildError(f"bad glob pattern {pattern!r}")
    parts = []
    segments = pattern.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
            continue
        if "**" in segment:
            raise BuildError(f"'**' must be a whole path segment in {pattern!r}")
        regex = "".join("[^/]*" if c == "*" else "[^/]" if c == "?" else re.escape(c)
                        for c in segment)
        parts.append(regex if last else regex + "/")
    return re.compile("".join(parts) + r"\Z")


def _is_subpackage(directory, root):
    return (os.path.normpath(directory) != os.path.normpath(str(root))
            and any(os.path.isfile(os.path.join(directory, n)) for n in BUILD_FILE_NAMES))


def _package_files(root, start=".", stop_at_packages=True):
    """Files under root/start (relative, '/'-separated), sorted.

    With stop_at_packages (as Bazel's glob does), directories holding their own
    BUILD file are left out.
    """
    # os.scandir and strings, not pathlib: the BUILD file globs ~100 times (pathlib's
    # relative_to made its evaluation 19 s here, this 1.6 s).
    found = []
    base = os.path.normpath(os.path.join(root, start))
    if not os.path.isdir(base):
        return found
    prefix = len(os.path.normpath(str(root))) + 1
    stack = [base]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir():
                    if (entry.name not in SKIP_DIRS and not entry.name.startswith("bazel-")
                            and not (stop_at_packages and _is_subpackage(entry.path, root))):
                        stack.append(entry.path)
                elif entry.is_file():
                    found.append(entry.path[prefix:].replace(os.sep, "/"))
    return sorted(found)


def bazel_glob(root, include, exclude=(), exclude_directories=1, allow_empty=True):
    """Files matched like Bazel's glob() in the package rooted at `root`."""
    del exclude_directories, allow_empty  # only files are matched here
    if isinstance(include, str) or isinstance(exclude, str):
        raise BuildError("glob() takes lists of patterns")
    matched = set()
    for pattern in include:
        # Walk only below the pattern's literal leading directories.
        literal = []
        for segment in pattern.split("/")[:-1]:
            if any(c in segment for c in "*?["):
                break
            literal.append(segment)
        regex = _glob_regex(pattern)
        matched.update(f for f in _package_files(root, "/".join(literal) or ".")
                       if regex.match(f))
    for pattern in exclude:
        regex = _glob_regex(pattern)
        matched = {f for f in matched if not regex.match(f)}
    return sorted(matched)


# ---------------------------------------------------------------------- evaluation


def evaluate_build(text, root):
    """Evaluates BUILD text against the tree at `root`: {target name: (rule, attrs)}."""
    targets = {}

    def recorder(kind):
        def rule(name, **attrs):
            if name in targets:
                raise BuildError(f"duplicate target {name!r}")
            targets[name] = (kind, attrs)
        return rule

    namespace = {"__builtins__": dict(_SAFE_BUILTINS, fail=_fail)}
    namespace.update({kind: recorder(kind) for kind in _RECORDED_RULES})
    namespace.update({call: (lambda *a, **k: None) for call in _IGNORED_CALLS})
    namespace["glob"] = lambda include, exclude=(), **kw: bazel_glob(root, include,
                                                                     exclude, **kw)
    try:
        exec(compile(text, "BUILD", "exec"), namespace)  # pylint: disable=exec-used
    except BuildError:
        raise
    except Exception as err:  # NameError for an unknown rule, SyntaxError, ...
        raise BuildError(f"cannot evaluate BUILD: {type(err).__name__}: {err}") from err
    return targets


def _label_to_path(label):
    """'//:a/b.py', ':a/b.py' or 'a/b.py' -> 'a/b.py'; None for other packages."""
    if label.startswith("@"):
        return None
    if label.startswith("//"):
        package, _, name = label[2:].partition(":")
        if package:
            return None
        return name
    return label[1:] if label.startswith(":") else label


def coverage_problems(root, targets):
    """Everything wrong with how `targets` cover the tree at `root` (empty if fine)."""
    problems = []
    generated = {out for kind, attrs in targets.values() if kind == "genrule"
                 for out in attrs.get("outs", [])}

    def resolves(label):
        path = _label_to_path(label)
        return path is None or path in targets or path in generated or (root / path).is_file()

    # Every file or label a target names exists.
    for name, (kind, attrs) in sorted(targets.items()):
        labels = [attrs[a] for a in ("main",) if a in attrs]
        for attr in ("srcs", "data", "deps"):
            labels.extend(attrs.get(attr, []))
        for label in labels:
            if not resolves(label):
                problems.append(f"{kind} {name!r} names {label!r}, which does not exist")

    # Every module is in exactly one py_library (binaries may repeat them).
    owners = {}
    for name, (kind, attrs) in targets.items():
        if kind == "py_library":
            for src in attrs.get("srcs", []):
                owners.setdefault(_label_to_path(src), []).append(name)
    modules = [f for f in _package_files(root, PACKAGE_DIR, stop_at_packages=False)
               if f.endswith(".py")]
    for module in modules:
        libraries = owners.get(module, [])
        if not libraries:
            problems.append(f"{module} is in no py_library")
        elif len(libraries) > 1:
            problems.append(f"{module} is in several py_library targets: {sorted(libraries)}")

    # Every test file has its own py_test that runs it.
    test_files = [f for f in _package_files(root, TESTS_DIR, stop_at_packages=False)
                  if re.fullmatch(r"tests/test_[^/]*\.py", f)]
    tested = {}
    for name, (kind, attrs) in targets.items():
        if kind != "py_test":
            continue
        srcs = [_label_to_path(s) for s in attrs.get("srcs", [])]
        own = [s for s in srcs if s and re.fullmatch(r"tests/test_[^/]*\.py", s)]
        if len(own) != 1:
            problems.append(f"py_test {name!r} should have one tests/test_*.py in srcs, has {own}")
            continue
        test_file = own[0]
        tested.setdefault(test_file, []).append(name)
        if name != test_file[len("tests/"):-len(".py")]:
            problems.append(f"py_test {name!r} runs {test_file}; name it after the file")
        if CONFTEST not in srcs:
            problems.append(f"py_test {name!r} lacks {CONFTEST} in srcs")
        main = _label_to_path(attrs.get("main", name + ".py"))
        if main not in srcs:
            problems.append(f"py_test {name!r}: main {main!r} is not in srcs")
        elif main != test_file and not any(test_file in arg for arg in attrs.get("args", [])):
            problems.append(f"py_test {name!r}: main {main!r} is not given {test_file} in args")
        deps = attrs.get("deps", [])
        if not any(targets.get(_label_to_path(d), ("",))[0] == "py_library" for d in deps):
            problems.append(f"py_test {name!r} depends on no py_library")
    for test_file in test_files:
        if test_file not in tested:
            problems.append(f"{test_file} has no py_test")
        elif len(tested[test_file]) > 1:
            problems.append(f"{test_file} is run by several py_test targets: "
                            f"{sorted(tested[test_file])}")
    return problems


def nested_build_files(root):
    """BUILD files below the top level, which would cut their directory out of globs."""
    return sorted(p.relative_to(root).as_posix()
                  for d in (PACKAGE_DIR, TESTS_DIR) for n in BUILD_FILE_NAMES
                  for p in (root / d).rglob(n))


# --------------------------------------------------------------- the real BUILD


@pytest.fixture(scope="module")
def build_text():
    return (REPO_ROOT / "BUILD").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def targets(build_text):
    return evaluate_build(build_text, REPO_ROOT)


def test_build_covers_every_module_and_test_file(targets):
    assert coverage_problems(REPO_ROOT, targets) == []


def test_build_has_the_expected_targets(targets):
    kinds = {name: kind for name, (kind, _) in targets.items()}
    assert kinds["tf_tempered"] == "py_library"
    assert kinds["test_build"] == "py_test"
    for test_file in sorted((REPO_ROOT / "tests").glob("test_*.py")):
        assert kinds.get(test_file.stem) == "py_test", test_file.name


def test_no_nested_build_files():
    assert nested_build_files(REPO_ROOT) == []


@pytest.mark.parametrize("name", ["BUILD", "WORKSPACE", ".bazelrc"])
def test_bazel_files_have_the_license_header(name):
    path = REPO_ROOT / name
    if not path.is_file():
        pytest.skip(f"no {name}")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[:len(LICENSE_HEADER)] == LICENSE_HEADER


# ------------------------------------------------------------ the checker itself


def _write(root, files):
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


_EXPLICIT_BUILD = """
py_library(
    name = "tf_tempered",
    srcs = ["tf_tempered/__init__.py", "tf_tempered/core.py"],
)
py_test(
    name = "test_core",
    srcs = ["tests/test_core.py", "tests/conftest.py"],
    main = "tests/test_core.py",
    deps = [":tf_tempered"],
)
"""

_TREE = {
    "tf_tempered/__init__.py": "",
    "tf_tempered/core.py": "",
    "tests/conftest.py": "",
    "tests/test_core.py": "",
}


def test_glob_follows_bazel_semantics(tmp_path):
    _write(tmp_path, {"a/x.py": "", "a/b/y.py": "", "a/b/c/z.py": "", "a/b/w.txt": "",
                      "a/__pycache__/x.cpython-311.pyc": "", "sub/BUILD": "",
                      "sub/s.py": "", "a/sub/BUILD.bazel": "", "a/sub/t.py": ""})
    assert bazel_glob(tmp_path, ["a/**/*.py"]) == ["a/b/c/z.py", "a/b/y.py", "a/x.py"]
    assert bazel_glob(tmp_path, ["a/*.py"]) == ["a/x.py"]
    assert bazel_glob(tmp_path, ["a/**"]) == ["a/b/c/z.py", "a/b/w.txt", "a/b/y.py", "a/x.py"]
    assert bazel_glob(tmp_path, ["a/**/*.py"], exclude=["a/b/**"]) == ["a/x.py"]
    assert bazel_glob(tmp_path, ["a/?.py", "**/s.py"]) == ["a/x.py"]  # sub/ is a package


def test_checker_accepts_a_complete_explicit_build(tmp_path):
    _write(tmp_path, _TREE)
    assert coverage_problems(tmp_path, evaluate_build(_EXPLICIT_BUILD, tmp_path)) == []


def test_checker_flags_a_new_module_and_test_file(tmp_path):
    _write(tmp_path, dict(_TREE, **{"tf_tempered/sub/new.py": "", "tests/test_new.py": ""}))
    problems = coverage_problems(tmp_path, evaluate_build(_EXPLICIT_BUILD, tmp_path))
    assert problems == ["tf_tempered/sub/new.py is in no py_library",
                        "tests/test_new.py has no py_test"]


def test_checker_flags_missing_files_and_bad_tests(tmp_path):
    _write(tmp_path, _TREE)
    text = _EXPLICIT_BUILD.replace('"tf_tempered/core.py"', '"tf_tempered/gone.py"')
    text += """
py_library(name = "again", srcs = ["tf_tempered/__init__.py"])
py_test(name = "test_other", srcs = ["tests/test_core.py"], deps = ["//:tf_tempered"])
"""
    problems = coverage_problems(tmp_path, evaluate_build(text, tmp_path))
    assert problems == [
        "py_library 'tf_tempered' names 'tf_tempered/gone.py', which does not exist",
        "tf_tempered/__init__.py is in several py_library targets: ['again', 'tf_tempered']",
        "tf_tempered/core.py is in no py_library",
        "py_test 'test_other' runs tests/test_core.py; name it after the file",
        "py_test 'test_other' lacks tests/conftest.py in srcs",
        "py_test 'test_other': main 'test_other.py' is not in srcs",
        "tests/test_core.py is run by several py_test targets: ['test_core', 'test_other']",
    ]


def test_checker_rejects_unknown_rules_and_duplicates(tmp_path):
    with pytest.raises(BuildError, match="cc_library"):
        evaluate_build('cc_library(name = "x")', tmp_path)
    with pytest.raises(BuildError, match="duplicate"):
        evaluate_build('py_library(name = "x")\npy_library(name = "x")', tmp_path)


def test_real_build_picks_up_new_modules_and_tests(tmp_path, build_text):
    """The repository's BUILD (globs) covers files added after it was written."""
    for relative in _package_files(REPO_ROOT, PACKAGE_DIR) + _package_files(REPO_ROOT, TESTS_DIR):
        if relative.endswith(".py"):
            _write(tmp_path, {relative: ""})
    for name in ("setup.cfg", "LICENSE"):
        shutil.copy(REPO_ROOT / name, tmp_path / name)
    _write(tmp_path, {"tf_tempered/brand_new.py": "", "tf_tempered/privacy/newer.py": "",
                      "tf_tempered/newpkg/__init__.py": "", "tests/test_brand_new.py": ""})
    targets = evaluate_build(build_text, tmp_path)
    assert coverage_problems(tmp_path, targets) == []
    assert targets["test_brand_new"][0] == "py_test"
    # ...while a nested BUILD file would cut a directory out of the globs.
    _write(tmp_path, {"tf_tempered/newpkg/BUILD": ""})
    assert nested_build_files(tmp_path) == ["tf_tempered/newpkg/BUILD"]
    assert ("tf_tempered/newpkg/__init__.py is in no py_library"
            in coverage_problems(tmp_path, evaluate_build(build_text, tmp_path)))


# ------------------------------------------------------------ setup.cfg requirements

# Top-level import name -> distribution name, where they differ (PEP 503-normalized).
IMPORT_TO_DISTRIBUTION = {
    "absl": "absl-py",
    "sklearn": "scikit-learn",
    "tf_keras": "tf-keras",
    "tensorflow_privacy": "tensorflow-privacy",
    "tensorflow_datasets": "tensorflow-datasets",
    "dp_accounting": "dp-accounting",
    "PIL": "pillow",
    "yaml": "pyyaml",
}
# Declared requirements that tf_tempered does not import itself, and why they are declared.
INDIRECT_REQUIREMENTS = {
    "importlib-resources": "tensorflow-datasets imports it to download, without declaring it",
}
# Imports of optional features: {distribution: the setup.cfg extra that must declare it}.
# The importing module raises ImportError with the pip command when it is missing.
OPTIONAL_REQUIREMENTS = {
    "kymatio": "scatternet",  # tf_tempered/scatternet/, the ScatterNet features only
}


def _extra_requires(setup_cfg_text, extra):
    parser = configparser.ConfigParser(comment_prefixes=("#", ";"), inline_comment_prefixes=None)
    parser.read_string(setup_cfg_text)
    lines = parser.get("options.extras_require", extra, fallback="").splitlines()
    return {_normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", ln.strip()).group(0))
            for ln in lines if ln.strip() and not ln.strip().startswith("#")}


def _normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def install_requires(setup_cfg_text):
    """{normalized distribution name: requirement line} of [options] install_requires."""
    parser = configparser.ConfigParser(comment_prefixes=("#", ";"), inline_comment_prefixes=None)
    parser.read_string(setup_cfg_text)
    declared = {}
    for line in parser.get("options", "install_requires", fallback="").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line)
            if name is None:
                raise ValueError(f"setup.cfg: cannot read the requirement {line!r}")
            declared[_normalize(name.group(0))] = line
    return declared


def third_party_imports(root):
    """{top-level module: [files importing it]} for absolute non-stdlib imports under root."""
    found = {}
    for relative in _package_files(root, PACKAGE_DIR, stop_at_packages=False):
        if not relative.endswith(".py"):
            continue
        tree = ast.parse((root / relative).read_text(encoding="utf-8"), relative)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != PACKAGE_DIR and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(relative)
    return found


def requirement_problems(root):
    """Imports missing from install_requires, and declared requirements nothing needs."""
    declared = install_requires((root / "setup.cfg").read_text(encoding="utf-8"))
    problems = []
    needed = set()
    for module, files in sorted(third_party_imports(root).items()):
        distribution = _normalize(IMPORT_TO_DISTRIBUTION.get(module, module))
        needed.add(distribution)
        extra = OPTIONAL_REQUIREMENTS.get(distribution)
        if extra is not None:
            if distribution not in _extra_requires(
                    (root / "setup.cfg").read_text(encoding="utf-8"), extra):
                problems.append(f"{module} (imported by {', '.join(sorted(set(files)))}) is not "
                                f"in setup.cfg's [{extra}] extra; add {distribution}")
            continue
        if distribution not in declared:
            problems.append(f"{module} (imported by {', '.join(sorted(set(files)))}) is not in "
                            f"setup.cfg install_requires; add {distribution}")
    for distribution in sorted(set(declared) - needed - set(INDIRECT_REQUIREMENTS)):
        problems.append(f"install_requires has {declared[distribution]!r}, which tf_tempered "
                        "never imports; drop it or say why in INDIRECT_REQUIREMENTS")
    return problems


def test_install_requires_covers_every_runtime_import():
    assert requirement_problems(REPO_ROOT) == []
    imported = third_party_imports(REPO_ROOT)
    # Spot checks that the scan sees nested and function-level imports.
    assert "tf_tempered/privacy/poisson_draws.py" in imported["scipy"]
    assert "tf_tempered/_compat.py" in imported["tf_keras"]
    assert "tf_tempered/_compat.py" in imported["keras"]  # inside bootstrap()


def test_requirement_checker_flags_undeclared_and_unused(tmp_path):
    _write(tmp_path, {
        "setup.cfg": ("[options]\ninstall_requires =\n    numpy >= 1.23\n"
                      "    # a comment\n    absl-py >= 1.0; python_version < \"3.12\"\n"
                      "    importlib_resources >= 5.10\n    pandas\n"),
        "tf_tempered/__init__.py": "import os\nimport numpy as np\nfrom tf_tempered import a\n",
        "tf_tempered/a.py": "from absl import flags\nfrom . import b\n",
        "tf_tempered/sub/b.py": "def f():\n    from scipy.stats import norm\n    import sklearn\n",
    })
    assert install_requires((tmp_path / "setup.cfg").read_text())["absl-py"].startswith("absl-py")
    assert requirement_problems(tmp_path) == [
        "scipy (imported by tf_tempered/sub/b.py) is not in setup.cfg install_requires; "
        "add scipy",
        "sklearn (imported by tf_tempered/sub/b.py) is not in setup.cfg install_requires; "
        "add scikit-learn",
        "install_requires has 'pandas', which tf_tempered never imports; drop it or say why "
        "in INDIRECT_REQUIREMENTS",
    ]


def test_license_is_an_spdx_expression_without_classifier():
    """setuptools >= 77 deprecates `License ::` classifiers next to a license expression."""
    parser = configparser.ConfigParser()
    parser.read_string((REPO_ROOT / "setup.cfg").read_text(encoding="utf-8"))
    assert parser.get("metadata", "license_expression") == "Apache-2.0"
    assert not parser.has_option("metadata", "license")
    classifiers = parser.get("metadata", "classifiers").splitlines()
    assert [c for c in classifiers if c.strip().startswith("License ::")] == []
    pyproject = (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'requires = \["setuptools >= (7[7-9]|[89]\d)', pyproject), pyproject


SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12", "3.13")


def test_python_versions_and_the_tf_privacy_marker():
    """3.10-3.13 are supported; TF Privacy (last release: Python < 3.12) only where it installs.

    Without the marker, pip on 3.12+ would backtrack to tensorflow-privacy 0.8.11 (2023).
    """
    parser = configparser.ConfigParser(comment_prefixes=("#", ";"), inline_comment_prefixes=None)
    parser.read_string((REPO_ROOT / "setup.cfg").read_text(encoding="utf-8"))
    assert parser.get("options", "python_requires") == ">=3.10, <3.14"
    classifiers = {c.strip() for c in parser.get("metadata", "classifiers").splitlines()}
    for version in SUPPORTED_PYTHONS:
        assert f"Programming Language :: Python :: {version}" in classifiers, version
    requirement = install_requires(
        (REPO_ROOT / "setup.cfg").read_text(encoding="utf-8"))["tensorflow-privacy"]
    assert requirement.replace(" ", "") == 'tensorflow-privacy==0.9.*;python_version<"3.12"'


# ------------------------------------------------------------------- layering

# The application subpackages (BUILD's :audit and :experiments) build on the library
# (:tf_tempered); the library must not import them back.
APPLICATION_SUBPACKAGES = ("audit", "experiments")


def _imported_modules(tree, module_name, is_package):
    """Absolute names of the modules an AST imports (relative imports resolved)."""
    package = module_name if is_package else module_name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def layering_problems(root):
    """Library modules that import an application subpackage."""
    problems = []
    apps = tuple(f"{PACKAGE_DIR}.{sub}" for sub in APPLICATION_SUBPACKAGES)
    for relative in _package_files(root, PACKAGE_DIR, stop_at_packages=False):
        parts = relative[:-len(".py")].split("/") if relative.endswith(".py") else None
        if parts is None or parts[1] in APPLICATION_SUBPACKAGES:
            continue
        is_package = parts[-1] == "__init__"
        module_name = ".".join(parts[:-1] if is_package else parts)
        tree = ast.parse((root / relative).read_text(encoding="utf-8"), relative)
        bad = {name for name in _imported_modules(tree, module_name, is_package)
               if any(name == app or name.startswith(app + ".") for app in apps)}
        # `from a.b import c` yields a.b and a.b.c (c may be a module); name only a.b.
        bad = sorted(n for n in bad if not any(n.startswith(o + ".") for o in bad))
        if bad:
            problems.append(f"{relative} imports {', '.join(bad)}; the library must not depend "
                            "on the application subpackages")
    return problems


def test_library_does_not_import_experiments_or_audit():
    assert layering_problems(REPO_ROOT) == []


def test_layering_checker_flags_absolute_and_relative_imports(tmp_path):
    _write(tmp_path, {
        "tf_tempered/__init__.py": "from tf_tempered import experiments\n",
        "tf_tempered/train.py": "from tf_tempered.experiments.train import cli\n",
        "tf_tempered/privacy/x.py": "from ..audit import attacks\nfrom . import y\n",
        "tf_tempered/privacy/y.py": "import tf_tempered.privacy.x\n",
        "tf_tempered/experiments/train.py": "from tf_tempered.audit import cli\n",
    })
    assert layering_problems(tmp_path) == [
        "tf_tempered/__init__.py imports tf_tempered.experiments; the library must not "
        "depend on the application subpackages",
        "tf_tempered/privacy/x.py imports tf_tempered.audit; the library must not depend on "
        "the application subpackages",
        "tf_tempered/train.py imports tf_tempered.experiments.train; the library must not "
        "depend on the application subpackages",
    ]
