"""`Page`: one self-contained HTML document, its data embedded as JSON beside the script.

A page is the template (`template.html`) with three things written into it: the style
(`viewer.css`), the script (`viewer.js`, written for this package, no library) and the
data, a JSON object whose `kind` names the view the script draws (`"attention"`,
`"bars"`, `"patching"`). Nothing is fetched when the page opens: the template's content
security policy forbids every request, so a page saved today opens the same way offline,
from a `file://` URL, in a notebook, or attached to an e-mail.

Arrays of many floats (attention patterns) travel as base64 little-endian float32
(`float32_base64`): exact to float32, 5.3 characters a value, and decoded by the script
into a `Float32Array`.
"""

import base64
import ctypes
import dataclasses
import functools
import html
import json
import math
import re
import struct
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

# JSON inside <script> ends at the first "</script"; these escapes keep every string
# (a token, a label, a title) from closing the element or opening another, and JSON.parse
# reads them back as the same characters.
_SCRIPT_SAFE = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"}
_PLACEHOLDER = re.compile(r"\{\{(title|style|data|script)\}\}")


def float32_base64(values: Float[Tensor, "..."]) -> str:
    """The tensor's values, flattened row-major, as base64 of little-endian float32."""
    flat = values.detach().to(torch.float32).reshape(-1).contiguous().cpu()
    if sys.byteorder == "little" and flat.numel():
        # The tensor's own bytes, copied once: no Python float per value (a list of a few
        # million floats takes ten times the memory of the page it encodes).
        raw = bytes((ctypes.c_char * flat.nbytes).from_address(flat.data_ptr()))
    else:
        raw = struct.pack(f"<{flat.numel()}f", *flat.tolist())
    return base64.b64encode(raw).decode("ascii")


def _non_finite(data: Any, path: str = "data") -> Iterator[str]:
    """The path of every float in `data` (nested dicts and lists) that is NaN or infinite."""
    if isinstance(data, float):
        if not math.isfinite(data):
            yield f"{path} = {data}"
    elif isinstance(data, dict):
        for key, value in data.items():
            yield from _non_finite(value, f"{path}[{key!r}]")
    elif isinstance(data, list | tuple):
        for i, value in enumerate(data):
            yield from _non_finite(value, f"{path}[{i}]")


def script_json(data: dict[str, Any]) -> str:
    """`data` as JSON that is safe to place inside a `<script>` element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for char, escape in _SCRIPT_SAFE.items():
        text = text.replace(char, escape)
    return text


@functools.cache
def _asset(name: str) -> str:
    return resources.files("hookedattn.viewer").joinpath(name).read_text(encoding="utf-8")


@dataclasses.dataclass(frozen=True, repr=False)
class Page:
    """A view of some data as one HTML document: `save(path)`, or display it in a notebook.

    `data` is the JSON object the page's script draws (its `"kind"` picks the view);
    `height` is the pixel height a notebook gives the page's frame; `parts` names more
    of this package's scripts (`.js`, run before `viewer.js`, which they give a view) and
    stylesheets (`.css`) that the view needs.
    """

    title: str
    data: dict[str, Any]
    height: int = 720
    parts: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.data.get("kind"), str):
            raise ValueError(f"a page's data needs a 'kind' naming its view, got {self.data!r}")
        bad = list(_non_finite(self.data))
        if bad:
            raise ValueError(
                f"the {self.data['kind']} page's data holds {len(bad)} NaN or infinite "
                f"value(s), first {bad[0]}: the result it would show is not finite (the "
                f"model's weights or inputs make NaN or inf there), and a page shows numbers "
                f"only; find where they start with run_with_cache and torch.isfinite"
            )
        for name in self.parts:
            if not name.endswith((".js", ".css")):
                raise ValueError(f"a page's parts are .js and .css files, got {name!r}")

    def html(self) -> str:
        """The whole document: template, style, script and data, ready to be written out."""
        scripts = [name for name in self.parts if name.endswith(".js")]
        styles = [name for name in self.parts if name.endswith(".css")]
        script = "\n".join(_asset(name) for name in [*scripts, "viewer.js"])
        # The script is inlined: a "</script" in it would end the element early, and
        # "<!--" or "<script" would change how the HTML parser reads the rest.
        assert not any(s in script.lower() for s in ("</script", "<script", "<!--"))
        fields = {
            "title": html.escape(self.title),
            "style": "\n".join(_asset(name) for name in ["viewer.css", *styles]),
            "data": script_json({"title": self.title, **self.data}),
            "script": script,
        }
        # One pass, so that a placeholder spelled inside a title or a token stays text.
        return _PLACEHOLDER.sub(lambda m: fields[m.group(1)], _asset("template.html"))

    def save(self, path: str | Path) -> Path:
        """Write the page to `path` (UTF-8) and return the path; open it in any browser.
        A path that cannot be written (a folder, no permission, no such folder) is an
        `OSError` naming it."""
        path = Path(path)
        try:
            path.write_text(self.html(), encoding="utf-8")
        except OSError as error:
            raise type(error)(
                error.errno, f"cannot write the page to {path}: {error.strerror or error}"
            ) from None
        return path

    def _repr_html_(self) -> str:
        # A sandboxed frame: the page's script runs, isolated from the notebook's own page
        # (no shared styles, no access to the notebook), exactly as in the saved file.
        document = html.escape(self.html(), quote=True)
        return (
            f'<iframe srcdoc="{document}" sandbox="allow-scripts" title="{html.escape(self.title)}"'
            f' style="width:100%;height:{self.height}px;border:1px solid #ddd;resize:vertical">'
            "</iframe>"
        )

    def __repr__(self) -> str:
        size = len(self.html().encode("utf-8"))
        return (
            f"Page({self.data['kind']}: {self.title!r}, {size / 1024:.0f} KB; "
            f"save(path) writes it, a notebook shows it)"
        )
