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
"""README.md and the docs site's pages (docs/, mkdocs.yml): short, linked, runnable.

Text only (no TensorFlow): fast. The site itself is built by `.ci/run` with
`mkdocs build --strict`, which also checks anchors and the generated API reference; the
Quickstart is run by another test.
"""

import pathlib
import re

import pytest

# The code under test does not depend on the Keras version (tests/conftest.py).
pytestmark = pytest.mark.keras3_suite

REPO = pathlib.Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = REPO / "docs"
MAX_README_LINES = 250

# README's two set-up commands, exactly as a user copies them (.ci/run runs the second).
MAIN_JOB = ("python3 -m venv .venv && . .venv/bin/activate && pip install -e . && python -m "
            "tf_tempered.experiments.train --dataset=digits --batch_size=64 --learning_rate=0.5 "
            "--epochs=20 --output_dir=runs/digits")
TEST_COMMAND = ('python3 -m venv .venv && . .venv/bin/activate && pip install -e ".[dev]" && '
                "python -m pytest -q -n 2")

_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
# [text](target) and ![alt](target); a target ends at a space (an optional title follows).
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _pages():
    return [README] + sorted(DOCS.rglob("*.md"))


def _links(text):
    """Link targets of Markdown text, outside code blocks and code spans."""
    prose = _CODE_SPAN.sub("", _FENCE.sub("", text))
    return _LINK.findall(prose)


def quickstart_code(text):
    """The ```python block under the first heading that names the Quickstart, or None."""
    match = re.search(r"^#+ [^\n]*Quickstart[^\n]*\n(.*?)(?=^#+ |\Z)", text, re.M | re.S)
    if match is None:
        return None
    block = re.search(r"^```python\n(.*?)^```", match.group(1), re.M | re.S)
    return block.group(1) if block else None


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move details to docs/")


def test_readme_shows_the_two_setup_commands_verbatim():
    readme = README.read_text(encoding="utf-8")
    assert MAIN_JOB in readme.splitlines()
    assert TEST_COMMAND in readme.splitlines()


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_points_to_an_existing_file(page):
    broken = []
    for target in _links(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (http:, mailto:, ...) or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).is_file():
            broken.append(target)
    assert not broken, f"{page.relative_to(REPO)}: links to missing files: {broken}"


def test_link_extraction_skips_code():
    text = "[a](x.md) `[b](y.md)` ![c](img/z.png \"title\")\n```\n[d](w.md)\n```\n"
    assert _links(text) == ["x.md", "img/z.png"]


def test_readme_has_the_quickstart_and_the_home_page_the_same():
    readme = quickstart_code(README.read_text(encoding="utf-8"))
    assert readme is not None, "README.md needs a heading with 'Quickstart' and a ```python block"
    assert "make_private(" in readme and "model.fit(" in readme and "epsilon" in readme
    compile(readme, "README.md Quickstart", "exec")  # valid Python (it is run elsewhere)
    assert quickstart_code((DOCS / "index.md").read_text(encoding="utf-8")) == readme


def test_layers_page_holds_the_readmes_supported_layers_table():
    """README's table is the registry's (test_conformance_matrix.py); the page repeats it."""
    def table(text):
        lines = text.splitlines()
        start = lines.index("| Layer | Handler | How per-example gradient norms and the clipped "
                            "sum are computed |")
        end = start
        while end < len(lines) and lines[end].startswith("|"):
            end += 1
        return lines[start:end]

    readme = table(README.read_text(encoding="utf-8"))
    assert len(readme) > 10
    assert table((DOCS / "layers.md").read_text(encoding="utf-8")) == readme


def test_every_page_is_in_the_site_nav():
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    nav = re.findall(r"^\s+- (?:[^:\n]+: )?([\w/.-]+\.md)\s*$", config, re.M)
    assert nav, "mkdocs.yml has no nav"
    missing = [p for p in nav if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names missing pages: {missing}"
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.glob("*.md")}
    assert pages - set(nav) == set(), "docs/*.md pages left out of mkdocs.yml's nav"
