"""Point labels that never cover each other, and the check that a drawn figure's text does not overlap.

`place` labels the few points that matter, in priority order: each label tries a handful of positions around its
point and takes the first whose box, inside the axes, meets no text already there (tick labels, titles, legend,
labels placed before it); a label that finds no free position is left out and named in what `place` returns, so the
caller can put it in the legend or caption. `overlaps` draws a figure and returns every pair of drawn texts whose
boxes intersect: the report's tests assert it is empty for every chart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PathCollection
from matplotlib.figure import Figure
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

# offsets (points) from the point to the label's anchor, and the label's alignment there: above, below, right, left
# (far ones are drawn with a thin leader line to their point)
POSITIONS = [((0, 7), "center", "bottom"), ((0, -7), "center", "top"), ((7, 0), "left", "center"),
             ((-7, 0), "right", "center"), ((7, 7), "left", "bottom"), ((-7, 7), "right", "bottom"),
             ((7, -7), "left", "top"), ((-7, -7), "right", "top"),
             *[((dx, dy), ha, va) for distance in (22, 40, 60) for dx, dy, ha, va in (
                 (0, distance, "center", "bottom"), (0, -distance, "center", "top"),
                 (distance, distance, "left", "bottom"), (-distance, distance, "right", "bottom"),
                 (distance, -distance, "left", "top"), (-distance, -distance, "right", "top"))]]
MARKER = 5.0  # pixels around a plotted point that a label keeps clear of
PAD = 2.0  # pixels kept free around every label
GID = "corescale-label"
BACKING = {"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8}  # over lines


@dataclass
class Label:
    x: float
    y: float
    text: str
    style: dict = field(default_factory=dict)  # Annotation keywords (color, fontsize, weight)


def text_box(text: Text, renderer) -> Bbox:
    """The box of a text's own letters (an annotation's get_window_extent also spans its leader line)."""
    if isinstance(text, Annotation):
        text.update_positions(renderer)
    return Text.get_window_extent(text, renderer)


def drawn_texts(fig: Figure, dpi: float | None = None) -> list[tuple[Text, Bbox]]:
    """(artist, box in pixels) of every text the figure draws (at `dpi`, default the figure's): a renderer of its
    own records each draw_text call, so ticks outside the view and empty texts are not counted."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    original = fig.dpi
    if dpi is not None:
        fig.set_dpi(dpi)
    try:
        renderer = canvas.get_renderer()
        seen: dict[int, Text] = {}
        draw_text = renderer.draw_text

        def recording(gc, x, y, s, prop, angle, ismath=False, mtext=None):
            if mtext is not None and mtext.get_text().strip():
                seen.setdefault(id(mtext), mtext)
            return draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

        renderer.draw_text = recording  # this renderer only: nothing global changes
        try:
            fig.draw(renderer)
        finally:
            del renderer.draw_text
        return [(t, text_box(t, renderer)) for t in seen.values()]
    finally:
        fig.set_dpi(original)


def _meet(box: Bbox, other: Bbox, tolerance: float) -> bool:
    wide = min(box.x1, other.x1) - max(box.x0, other.x0)
    high = min(box.y1, other.y1) - max(box.y0, other.y0)
    return wide > tolerance and high > tolerance


def overlaps(fig: Figure, dpi: float | None = None, tolerance: float = 0.5) -> list[tuple[str, str]]:
    """Pairs of drawn texts whose boxes intersect by more than `tolerance` pixels each way."""
    texts = drawn_texts(fig, dpi)
    return [(a.get_text(), b.get_text()) for i, (a, box) in enumerate(texts) for b, other in texts[i + 1:]
            if _meet(box, other, tolerance)]


def _free(box: Bbox, taken: list[Bbox], inside: Bbox) -> bool:
    grown = box.padded(PAD)
    if box.x0 < inside.x0 or box.x1 > inside.x1 or box.y0 < inside.y0 or box.y1 > inside.y1:
        return False
    return not any(grown.overlaps(other) for other in taken)


def _crosses(note: Annotation, box: Bbox, texts: list[Bbox]) -> bool:
    """Whether the leader line from the point to the label passes through another text."""
    start = note.axes.transData.transform(note.xy)  # type: ignore[union-attr]
    end = np.array([(box.x0 + box.x1) / 2, (box.y0 + box.y1) / 2])
    return any(other.contains(*(start + (end - start) * t)) for t in np.linspace(0, 1, 24) for other in texts)


def _markers(ax) -> list[Bbox]:
    """A small box around every plotted point (scatter points and line markers) of the axes, in pixels."""
    points = [c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections
              if isinstance(c, PathCollection) and np.asarray(c.get_offsets()).size]
    points += [line.get_transform().transform(line.get_xydata()) for line in ax.get_lines()
               if line.get_marker() not in (None, "", "None", " ")]
    return [Bbox.from_extents(x - MARKER, y - MARKER, x + MARKER, y + MARKER)
            for group in points for x, y in group if np.isfinite(x) and np.isfinite(y)]


def place(ax, labels: list[Label]) -> list[Label]:
    """Annotates the points, most important first, where each label is clear of every other text; returns the
    labels that found no free position (not drawn)."""
    fig = ax.figure
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()  # the layout first: positions in pixels are final from here (labels stay out of the layout)
    renderer = canvas.get_renderer()
    texts = [box for _, box in drawn_texts(fig)]
    markers = _markers(ax)
    inside = ax.get_window_extent(renderer)
    left_out: list[Label] = []
    for rank, label in enumerate(labels):
        for offset, ha, va in POSITIONS:
            leader = {"arrowprops": {"arrowstyle": "-", "color": "0.5", "lw": 0.6, "shrinkA": 1, "shrinkB": 3}} \
                if max(map(abs, offset)) > 10 else {}
            note = ax.annotate(label.text, (label.x, label.y), xytext=offset, textcoords="offset points", ha=ha,
                               va=va, fontsize=label.style.get("fontsize", 8), **leader, bbox=BACKING,
                               **{k: v for k, v in label.style.items() if k != "fontsize"})
            note.set_in_layout(False)
            note.set_gid(GID)
            note.corescale_label, note.corescale_rank = label, rank
            box = text_box(note, renderer)
            if _free(box, texts + markers, inside) and not (leader and _crosses(note, box, texts)):
                texts.append(box)
                break
            note.remove()
        else:
            left_out.append(label)
    return left_out + [label for _, label in tidy(fig)]


def tidy(fig: Figure) -> list[tuple[Text, Label]]:
    """Removes the placed labels that now meet another text (a legend at loc="best" may move onto a label once the
    labels are there; a title added later moves the axes); returns them."""
    removed: list[tuple[Text, Label]] = []
    while True:
        texts = drawn_texts(fig)
        clash = [note for note, box in texts if note.get_gid() == GID and any(
            other is not note and _meet(box, other_box, 0.5) for other, other_box in texts)]
        if not clash:
            return removed
        last = max(clash, key=lambda note: note.corescale_rank)  # type: ignore[attr-defined]
        last.remove()  # the least important first: the one it met may be clear once it is gone
        removed.append((last, last.corescale_label))  # type: ignore[attr-defined]
