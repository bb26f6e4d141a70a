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
"""A griffe extension for the API reference (mkdocs.yml): tf_tempered's docstrings as Markdown.

The docstrings are Google style with two reStructuredText habits that Markdown does not
know, rewritten here before mkdocstrings renders them (the source is unchanged):

* doctest blocks (``>>>`` lines and their output, up to a blank line) become fenced
  ``pycon`` code blocks, so their brackets are not read as Markdown links;
* Sphinx roles (``:func:`x```, ``:class:`~a.b.C```, ``:mod:`.m```) become inline code.

A class whose docstring is made by code (``__doc__ = _doc("SGD")``, the DP optimizers)
has none that static analysis can read. When the code is a call of a module-level
function on literals, that function alone is run, with the module's string constants
(no import: TensorFlow stays out of the build); otherwise the module is imported and the
class's real ``__doc__`` used.
"""

import ast
import importlib
import inspect
import re

import griffe

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc|const):`~?([^`]+)`")


def _role(match):
    target = match.group(1)
    # Sphinx's "~a.b.C" shows "C"; a leading "." (relative to the module) is dropped.
    if match.group(0).split("`", 1)[1].startswith("~"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target.lstrip('.')}`"


def _fence_doctests(text):
    lines = text.split("\n")
    out = []
    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[:len(line) - len(stripped)]
        if out and out[-1].strip():
            out.append("")  # a fence needs a blank line before it inside a paragraph
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip():
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


def markdown_docstring(text):
    """``text`` with doctest blocks fenced and Sphinx roles turned into inline code."""
    return _ROLE.sub(_role, _fence_doctests(text))


def _doc_from_call(cls):
    """``cls.__doc__`` when it is ``helper(literals...)`` of a module-level function, else None."""
    try:
        call = ast.parse(str(cls.members["__doc__"].value), mode="eval").body
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)) or call.keywords:
            return None
        args = [ast.literal_eval(a) for a in call.args]
        module = cls.module
        namespace = {}
        for name, member in module.members.items():
            if not member.is_alias and member.is_attribute and isinstance(member.value, str):
                value = ast.literal_eval(member.value)
                if isinstance(value, str):
                    namespace.setdefault(name, value)  # the first assignment (Keras 3's)
        exec(module[call.func.id].source, namespace)  # pylint: disable=exec-used
        doc = namespace[call.func.id](*args)
        return doc if isinstance(doc, str) else None
    except Exception:  # pylint: disable=broad-except
        return None


class TfTemperedDocstrings(griffe.Extension):
    """Rewrites every docstring with :func:`markdown_docstring` as griffe loads it."""

    def on_instance(self, *, obj, **kwargs):  # pylint: disable=unused-argument
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)

    def on_class(self, *, cls, loader, **kwargs):  # pylint: disable=unused-argument
        if cls.docstring is not None or "__doc__" not in cls.members:
            return
        doc = _doc_from_call(cls)
        if doc is None:
            doc = getattr(importlib.import_module(cls.module.path), cls.name).__doc__
        if doc:
            cls.docstring = griffe.Docstring(
                markdown_docstring(inspect.cleandoc(doc)), parent=cls,
                parser=loader.docstring_parser, parser_options=loader.docstring_options)
