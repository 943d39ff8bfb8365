"""The stdlib byte corpus under its older import path: it lives in `hookedattn.training.corpus`.

Kept so that code reading `hookedattn.corpus` (the activation store's stdlib inputs, user
scripts) goes on working; new code imports `hookedattn.training.corpus`.
"""

from hookedattn.training.corpus import (
    BOS,
    HELDOUT_MODULUS,
    N_BYTES,
    VOCAB_SIZE,
    ByteCorpus,
    CorpusManifest,
    heldout_windows,
    is_heldout,
    load_stdlib_corpus,
    repeated_random_tokens,
    stdlib_root,
    text_windows,
)

__all__ = [
    "BOS",
    "HELDOUT_MODULUS",
    "N_BYTES",
    "VOCAB_SIZE",
    "ByteCorpus",
    "CorpusManifest",
    "heldout_windows",
    "is_heldout",
    "load_stdlib_corpus",
    "repeated_random_tokens",
    "stdlib_root",
    "text_windows",
]
