"""Figures for PNG output without pyplot: each figure gets its own Agg canvas, so plotting from a job thread or a
server never touches matplotlib's global backend."""

from __future__ import annotations


def agg_figure(width: float, height: float):
    """A matplotlib ``Figure`` of ``width`` x ``height`` inches at 100 dpi, on its own Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)  # the Agg canvas for this figure only: no pyplot, no global backend
    return fig
