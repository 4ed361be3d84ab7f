"""How benchmark tables are laid out in plain text: columns padded to their widest cell."""

from __future__ import annotations

from collections.abc import Sequence


def _widths(rows: Sequence[Sequence[str]]) -> list[int]:
    return [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    """The first column left-aligned, the others right-aligned, two spaces apart."""
    widths = _widths(rows)
    return ["  ".join(cell.ljust(widths[i]) if i == 0 else cell.rjust(widths[i]) for i, cell in enumerate(row))
            for row in rows]


def ruled(rows: Sequence[Sequence[str]], *, is_left_aligned: bool = False) -> str:
    """Every column right-aligned (or left-aligned), two spaces apart, a rule of dashes under the first row."""
    widths = _widths(rows)
    pad = str.ljust if is_left_aligned else str.rjust
    lines = ["  ".join(pad(cell, width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def label_and_text(rows: Sequence[tuple[str, str]]) -> str:
    """A label column padded to its widest, then free text: for results that are sentences, not numbers."""
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {text}".rstrip() for label, text in rows)


def fixed_width(cells: Sequence[str], width: int) -> str:
    """Cells right-aligned in columns of ``width``, one space apart: a row printed as soon as it is measured."""
    return " ".join(f"{cell:>{width}}" for cell in cells)
