"""hookedattn: a transformer built from hook points, and the instruments around it.

The package is the model core and the applications built on it:

    hookedattn.core      the model: hook points, config, components, kernels, cache, ...
    hookedattn.store     activation datasets on disk (collected under torchrun)
    hookedattn.sae       sparse autoencoders: train, load, splice
    hookedattn.viewer    self-contained HTML pages of attention and results
    hookedattn.training  the shipped models' corpus, trainer and checkpoints
    hookedattn.testing   assertions about models, and the pytest plugin's helpers

Each application depends on the core (and on applications above it in this list), never
the other way round. The core's public names are re-exported here, so `from hookedattn
import HookedTransformer` is the usual import. Modules that lived at `hookedattn.<name>`
before the core had its own package (`hookedattn.config`, `hookedattn.model`, ...) still
import, with a `DeprecationWarning` naming their new path.
"""

from hookedattn import _moved
from hookedattn.core import (
    SVD,
    ActivationCache,
    ByteTokenizer,
    CacheEditedError,
    CharTokenizer,
    CheckpointError,
    FactoredMatrix,
    GenerationOptions,
    GenerationPosition,
    GenerationStep,
    GenerationWithCache,
    HFTokenizer,
    HookedRootModule,
    HookedTransformer,
    HookedTransformerConfig,
    HookedTransformerKeyValueCache,
    HookPoint,
    KeyValueCache,
    KeyValueCacheEntry,
    LensHandle,
    LogitsAndLoss,
    MixerCacheEntry,
    PretrainedInfo,
    SpecialTokens,
    TokenizedText,
    Tokenizer,
    as_tokenizer,
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    generation_position,
    get_act_name,
    is_hook_point,
    list_pretrained,
    lm_cross_entropy_loss,
    names,
    pretrained_info,
    process_weights,
    record_patterns,
    stacked_patterns,
    tolerances,
)

_moved.install()

# The SAE package registers `model.saes` with the core (which never imports it).
from hookedattn import sae as _sae  # noqa: E402, F401

__all__ = [
    "SVD",
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
    "PretrainedInfo",
    "SpecialTokens",
    "TokenizedText",
    "Tokenizer",
    "as_tokenizer",
    "center_unembed",
    "center_writing_weights",
    "fold_layer_norm",
    "fold_value_biases",
    "generation_position",
    "get_act_name",
    "is_hook_point",
    "list_pretrained",
    "lm_cross_entropy_loss",
    "names",
    "pretrained_info",
    "process_weights",
    "record_patterns",
    "stacked_patterns",
    "tolerances",
]
