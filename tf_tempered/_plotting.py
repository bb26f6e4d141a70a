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
"""Figures for the package's PNG outputs, without touching matplotlib's global backend."""

__all__ = ["agg_figure"]


def agg_figure(nrows=1, ncols=1, *, figsize=(5, 3.5)):
    """(figure, axes list) on matplotlib's Agg canvas, constrained layout.

    The global pyplot backend is left alone, so scripts and callbacks can run inside
    notebooks without switching their plotting backend.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # pylint: disable=g-import-not-at-top
    from matplotlib.figure import Figure  # pylint: disable=g-import-not-at-top
    figure = Figure(figsize=figsize, constrained_layout=True)
    FigureCanvasAgg(figure)
    axes = [figure.add_subplot(nrows, ncols, i + 1) for i in range(nrows * ncols)]
    return figure, axes
