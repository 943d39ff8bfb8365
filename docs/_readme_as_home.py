"""mkdocs hook: the site's home page is the README, with its links made relative to `docs/`.

So the README (the first read on a repository page) and the site's home page are one text.
"""

from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_read_source(page, config):
    """The README's text for `index.md`; every other page is read as usual (None)."""
    if page.file.src_uri != "index.md":
        return None
    return README.read_text().replace("](docs/", "](")
