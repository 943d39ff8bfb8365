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

from hookedattn import names, tolerances
from hookedattn._pretrained import PretrainedInfo, list_pretrained, pretrained_info
from hookedattn._tokenization import TokenizedText
from hookedattn._weights_io import CheckpointError
from hookedattn.cache import ActivationCache, CacheEditedError
from hookedattn.config import HookedTransformerConfig
from hookedattn.factored_matrix import SVD, FactoredMatrix
from hookedattn.hook_points import HookedRootModule, HookPoint, LensHandle, is_hook_point
from hookedattn.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.loss import lm_cross_entropy_loss
from hookedattn.model import HookedTransformer, LogitsAndLoss
from hookedattn.names import get_act_name
from hookedattn.processing import (
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from hookedattn.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    SpecialTokens,
    Tokenizer,
    as_tokenizer,
)

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
    "SpecialTokens",
    "TokenizedText",
    "Tokenizer",
    "as_tokenizer",
    "center_unembed",
    "center_writing_weights",
    "fold_layer_norm",
    "fold_value_biases",
    "get_act_name",
    "is_hook_point",
    "list_pretrained",
    "lm_cross_entropy_loss",
    "names",
    "pretrained_info",
    "process_weights",
    "tolerances",
]
