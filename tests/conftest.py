"""Suite-wide settings and fixtures. Imports nothing from hookedattn or analysis at the top:
jaxtyping's import hook instruments those packages only if they are first imported after
pytest has configured it, so the fixtures import them when they run.

The tests' models come from `hookedattn.testing` (`tiny_model`, `random_tiny_model`,
`random_tokens`, and the `make_tiny_model` fixture of its pytest plugin); this file holds
what only this suite needs; what several test files share is in `tests/helpers/`.
"""

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

# No test reaches the real hub, or reads or fills the machine's cache: `huggingface_hub`
# (read when first imported, after this) starts offline on an empty cache of the suite's
# own, with no token. The tests of loading by name serve a hub of their own
# (tests/helpers/hub.py) and point the client at it.
_HF_HOME = tempfile.mkdtemp(prefix="hookedattn-tests-hf-")
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "HF_HUB_CACHE"):
    os.environ.pop(_name, None)
os.environ.update(HF_HOME=_HF_HOME, HF_HUB_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")

# Nor hookedattn's own cache (`from_hf`'s memo of the architectures verified on load,
# hookedattn.core.hf._verify): the suite keeps one of its own, so each kind of checkpoint is
# verified once per session, and every subprocess it starts shares it.
os.environ["HOOKEDATTN_CACHE"] = tempfile.mkdtemp(prefix="hookedattn-tests-cache-")
# Both folders go when the session's process ends (each xdist worker has its own).
for _folder in (_HF_HOME, os.environ["HOOKEDATTN_CACHE"]):
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)

# The suite runs thousands of tiny forwards, where a second intra-op thread costs more in
# synchronisation than it gains (and, on a shared 2-core machine, far more).
torch.set_num_threads(1)


@pytest.fixture
def saved_byte_model() -> Callable[..., Any]:
    """`saved_byte_model(folder, seed)`: a tiny random attention-only model over bytes, saved
    to `folder` (for a subprocess to load) and loaded back from it, with a byte tokenizer."""
    from hookedattn import ByteTokenizer, HookedTransformer
    from hookedattn.testing import random_tiny_model

    def build(folder: Path, seed: int) -> Any:
        fields = dict(n_heads=2, d_head=8, d_vocab=259, attn_only=True, dtype=torch.float32)
        random_tiny_model(randomize_seed=seed, **fields).save(folder)
        model = HookedTransformer.load(folder)
        model.tokenizer = ByteTokenizer()
        return model

    return build


@dataclass(frozen=True)
class MainDemo:
    """tests/tl/tl_main_demo.py, TransformerLens code run on `config` and given `weights` by its
    caller: `source` as written, `ported` with its TransformerLens import changed to
    hookedattn_tl (the one change a user makes)."""

    path: Path
    config: dict[str, Any]
    source: str
    ported: str


@pytest.fixture(scope="session")
def main_demo() -> MainDemo:
    """The Main-Demo-style script both implementations run, and its config: small, with every
    part the demo reads (LayerNorm, a GELU MLP, several heads)."""
    path = Path(__file__).parent / "tl" / "tl_main_demo.py"
    source = path.read_text()
    assert source.splitlines().count("import transformer_lens") == 1
    ported = source.replace(
        "\nimport transformer_lens\n", "\nimport hookedattn_tl as transformer_lens\n"
    ).replace("from transformer_lens import", "from hookedattn_tl import")
    sizes = dict(n_layers=2, n_heads=4, d_head=8, d_model=32, d_mlp=64, d_vocab=40, n_ctx=32)
    config = dict(**sizes, act_fn="gelu", normalization_type="LN")
    return MainDemo(path, config, source, ported)
