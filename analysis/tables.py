"""`Table`: what `.top(k)` and `.to_table()` return, a few aligned columns a person can read.

A table is data first (its `rows` are plain Python values: labels, floats, token ids), so
a script can use it, and text second (its `repr` is the aligned table, for the REPL).
"""

import dataclasses
from collections.abc import Iterator


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@dataclasses.dataclass(frozen=True)
class Table:
    """Rows of plain values under named columns; its `repr` is the table, aligned.

    `table.column("label")` is one column as a tuple; iterating gives the rows.
    """

    columns: tuple[str, ...]
    rows: tuple[tuple[object, ...], ...]
    title: str = ""

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(
                    f"a row of {len(row)} values under {len(self.columns)} columns "
                    f"{self.columns}: {row!r}"
                )

    def column(self, name: str) -> tuple[object, ...]:
        """The values of column `name`, top to bottom."""
        if name not in self.columns:
            raise KeyError(f"no column {name!r}; the columns are {self.columns}")
        index = self.columns.index(name)
        return tuple(row[index] for row in self.rows)

    def __iter__(self) -> Iterator[tuple[object, ...]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        cells = [list(self.columns)] + [[_cell(v) for v in row] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.columns))]
        numeric = [
            all(isinstance(row[i], int | float) for row in self.rows) and bool(self.rows)
            for i in range(len(self.columns))
        ]
        lines = [self.title] if self.title else []
        for r in cells:
            parts = [
                c.rjust(w) if is_num else c.ljust(w)
                for c, w, is_num in zip(r, widths, numeric, strict=True)
            ]
            lines.append("  ".join(parts).rstrip())
        return "\n".join(lines)

    __str__ = __repr__
