"""The model core: a decoder-only transformer built from hook points, and what it is made of.

    config          HookedTransformerConfig, every variant decided once
    hook_points     HookPoint: where activations are read and replaced
    hooked_root     HookedRootModule: hook points named, attached by name, scoped
    names           the one place hook names are spelled and shorthand is expanded
    components      the equations: embed, attention, MLP, norms, blocks, unembed
    kernels         how a sublayer runs: fused or written out, guards, masks
    model           HookedTransformer: prepare the input, run the blocks, unembed
    cache           ActivationCache, what run_with_cache returns
    kv_cache        keys and values of positions already run (generation)
    generation      generate, generate_steps, generate_stream: the one loop and its options
    shapes          the tensors passed around, named once with their axes
    hf              importers of HuggingFace families
    processing      weight folding and centring
    factored_matrix FactoredMatrix, for circuits
    tokenizers      byte, char and HuggingFace tokenizers behind one interface

Nothing here imports the applications beside it (`hookedattn.store`, `.sae`, `.viewer`,
`.training`, `.testing`) or `analysis`.

Axis names, used in every shape annotation and einops pattern in this package and in
`analysis`:

    batch       sequences in a batch
    pos         token positions (query_pos / key_pos inside attention)
    d_model     the residual stream
    head        attention heads; d_head the width of one head's q, k, v, z
    kv_head     key/value heads (grouped-query attention)
    q_rank, kv_rank  latent attention's query and key/value latents; d_rope the rotated
                part of its query/key head; d_head_v its value head (d_head elsewhere)
    index_head, d_index  a lightning indexer's heads and their width; d_query what its
                queries read (the query latent, or the stream)
    channel, d_conv  a hybrid's convolution: its channels and the positions it spans
    ssm_head, d_ssm_head, d_state, group  a Mamba-2 mixer's heads, their width, the state
                per head row, the groups of heads sharing B and C; d_inner its inner width
    d_mlp       MLP neurons
    expert      the experts of a mixture of experts; k the experts one token uses
    row         one expert's rows: the tokens routed to it, in (batch, pos) order
    d_vocab     input vocabulary; d_vocab_out the output vocabulary
    layer       blocks
    component   terms of a residual-stream decomposition

Weights use the row-vector convention of the circuits papers: `q = x @ W_Q[h]`, and
`W_Q, W_K, W_V: [head d_model d_head]`, `W_O: [head d_head d_model]`.
"""

from hookedattn.core import names, tolerances
from hookedattn.core._memory import free_memory
from hookedattn.core._pretrained import PretrainedInfo, list_pretrained, pretrained_info
from hookedattn.core._tokenization import TokenizedText
from hookedattn.core._variants import variant_base
from hookedattn.core._weight_views import require_bilinear_scores
from hookedattn.core._weights_io import (
    CONFIG_FILE,
    MAX_CONFIG_BYTES,
    WEIGHTS_FILE,
    CheckpointError,
    TensorHeader,
    read_config,
    read_safetensors_header,
)
from hookedattn.core.cache import ActivationCache, CacheEditedError
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.factored_matrix import SVD, FactoredMatrix
from hookedattn.core.float64 import float64_throughout
from hookedattn.core.generation import (
    GenerationOptions,
    GenerationPosition,
    GenerationStep,
    GenerationWithCache,
    generation_position,
)
from hookedattn.core.hook_points import (
    HookPoint,
    LensHandle,
    hooks_version,
    is_hook_point,
)
from hookedattn.core.hooked_root import HookedRootModule
from hookedattn.core.html import html_table
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry, MixerCacheEntry
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.core.mixer_config import MixerConfig
from hookedattn.core.model import HookedTransformer, LogitsAndLoss
from hookedattn.core.names import get_act_name
from hookedattn.core.patterns import record_patterns, stacked_patterns
from hookedattn.core.processing import (
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from hookedattn.core.tokenizers import (
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    SpecialTokens,
    Tokenizer,
    as_tokenizer,
    is_text,
    tokenizer_of,
)

# TransformerLens's names for the same things, so that code ports by changing imports.
HookedTransformerKeyValueCache = KeyValueCache

__all__ = [
    "CONFIG_FILE",
    "MAX_CONFIG_BYTES",
    "SVD",
    "WEIGHTS_FILE",
    "ActivationCache",
    "ByteTokenizer",
    "CacheEditedError",
    "CharTokenizer",
    "CheckpointError",
    "FactoredMatrix",
    "GenerationOptions",
    "GenerationPosition",
    "GenerationStep",
    "GenerationWithCache",
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
    "MixerCacheEntry",
    "MixerConfig",
    "PretrainedInfo",
    "SpecialTokens",
    "TensorHeader",
    "TokenizedText",
    "Tokenizer",
    "as_tokenizer",
    "center_unembed",
    "center_writing_weights",
    "float64_throughout",
    "fold_layer_norm",
    "fold_value_biases",
    "free_memory",
    "generation_position",
    "get_act_name",
    "hooks_version",
    "html_table",
    "is_hook_point",
    "is_text",
    "list_pretrained",
    "lm_cross_entropy_loss",
    "names",
    "pretrained_info",
    "process_weights",
    "read_config",
    "read_safetensors_header",
    "record_patterns",
    "require_bilinear_scores",
    "stacked_patterns",
    "tokenizer_of",
    "tolerances",
    "variant_base",
]
