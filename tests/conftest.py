"""Suite-wide settings and fixtures. Imports nothing from hookedattn or analysis at the top:
jaxtyping's import hook instruments those packages only if they are first imported after
pytest has configured it, so the fixtures import them when they run.

The tests' models come from `hookedattn.testing` (`tiny_model`, `random_tiny_model`,
`random_tokens`, and the `make_tiny_model` fixture of its pytest plugin); this file holds
what only this suite needs.
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

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
