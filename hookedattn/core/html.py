"""Compact HTML tables: what `_repr_html_` shows of a cache or a result in a notebook.

Static markup with inline styles (a notebook keeps no stylesheet of ours) and no script;
every cell is escaped, so a label or a token is text, whatever it contains.
"""

import html
from collections.abc import Sequence

_TABLE = "border-collapse:collapse;font:12px/1.3 ui-monospace,monospace;margin:4px 0"
_CELL = "padding:1px 8px;border-bottom:1px solid #eee;text-align:{align}"
_HEAD = "padding:1px 8px;border-bottom:1px solid #999;text-align:{align}"


def _text(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _shade(value: object, scale: float) -> str:
    if not isinstance(value, float) or scale == 0 or value != value:  # NaN: unshaded
        return ""
    alpha = min(1.0, abs(value) / scale) * 0.6
    rgb = "29,78,216" if value >= 0 else "200,30,30"
    return f";background:rgba({rgb},{alpha:.3f})"


def html_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    caption: str = "",
    note: str = "",
    shade: bool = False,
) -> str:
    """Rows under named columns as an HTML table; numbers right-aligned, `.4g`.

    `shade=True` tints each float cell by its value against the largest magnitude
    (blue positive, red negative). `note` is a line under the table (e.g. rows left out).
    """
    numeric = [
        bool(rows) and all(isinstance(row[i], int | float) for row in rows)
        for i in range(len(columns))
    ]
    floats = [v for row in rows for v in row if isinstance(v, float) and v == v]
    scale = max((abs(v) for v in floats), default=0.0) if shade else 0.0
    align = ["right" if is_number else "left" for is_number in numeric]
    head = "".join(
        f'<th style="{_HEAD.format(align=a)}">{html.escape(str(c))}</th>'
        for c, a in zip(columns, align, strict=True)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td style="{_CELL.format(align=a)}{_shade(v, scale)}">{html.escape(_text(v))}</td>'
            for v, a in zip(row, align, strict=True)
        )
        + "</tr>"
        for row in rows
    )
    # A line above the table rather than a <caption>, which would wrap to the table's width.
    above = f'<div style="font-weight:600">{html.escape(caption)}</div>' if caption else ""
    below = f'<div style="font-size:11px;color:#666">{html.escape(note)}</div>' if note else ""
    table = f'<table style="{_TABLE}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'
    return f"<div>{above}{table}{below}</div>"
