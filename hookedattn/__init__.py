"""hookedattn: a small transformer built from hook points, and its instruments.

Axis names, used in every shape annotation and einops pattern in this package and in
`analysis`:

    batch       sequences in a batch
    pos         token positions (query_pos / key_pos inside attention)
    d_model     the residual stream
    head        attention heads; d_head the width of one head's q, k, v, z
    d_mlp       MLP neurons
    d_vocab     input vocabulary; d_vocab_out the output vocabulary
    layer       blocks
    component   terms of a residual-stream decomposition

Weights use the row-vector convention of the circuits papers: `q = x @ W_Q[h]`, and
`W_Q, W_K, W_V: [head d_model d_head]`, `W_O: [head d_head d_model]`.
"""

from hookedattn.cache import ActivationCache, CacheEditedError
from hookedattn.config import HookedTransformerConfig
from hookedattn.factored_matrix import SVD, FactoredMatrix
from hookedattn.hook_points import HookedRootModule, HookPoint, LensHandle
from hookedattn.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.model import HookedTransformer, LogitsAndLoss
from hookedattn.names import get_act_name
from hookedattn.pretrained import PretrainedInfo, list_pretrained
from hookedattn.processing import (
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from hookedattn.tokenization import TokenizedText
from hookedattn.tokenizers import ByteTokenizer, CharTokenizer, HFTokenizer, Tokenizer
from hookedattn.weights_io import CheckpointError

# TransformerLens's names for the same things, so that code ports by changing imports.
HookedTransformerKeyValueCache = KeyValueCache

__all__ = [
    "SVD",
    "ActivationCache",
    "ByteTokenizer",
    "CacheEditedError",
    "CharTokenizer",
    "CheckpointError",
    "FactoredMatrix",
    "HFTokenizer",
    "HookPoint",
    "HookedRootModule",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "KeyValueCache",
    "KeyValueCacheEntry",
    "LensHandle",
    "LogitsAndLoss",
    "PretrainedInfo",
    "TokenizedText",
    "Tokenizer",
    "center_unembed",
    "center_writing_weights",
    "fold_layer_norm",
    "fold_value_biases",
    "get_act_name",
    "list_pretrained",
    "process_weights",
]
