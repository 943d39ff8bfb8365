"""From a name to a model: shipped names, folders, hub repo ids, TransformerLens's names.

    HookedTransformer.from_pretrained("gpt2-small")          # TL's alias of the hub's gpt2
    HookedTransformer.from_pretrained("EleutherAI/pythia-70m", checkpoint_value=1000)
    HookedTransformer.from_pretrained("org/name", revision="v1", token=...)
    HookedTransformer.from_hf("org/name", revision="abc123...")  # transformers checkpoints
    HF_HUB_OFFLINE=1 ...                                      # the filled cache only

`resolve` turns a name into files (`_resolve`), fetched through `huggingface_hub`
(`_fetch`: its cache, tokens, offline mode and progress bars; only the files an import
reads); `load_model` reads them with the reader of their kind (`_load`). The errors are
`HubError`s that name the repo, the revision, the cache and what to do.
"""

from hookedattn.core.hub._errors import (
    DownloadInterruptedError,
    GatedModelError,
    HubError,
    ModelNotFoundError,
    NotCachedError,
    NoWeightsError,
    RevisionNotFoundError,
)
from hookedattn.core.hub._fetch import HubOptions, snapshot
from hookedattn.core.hub._load import load_model, resolve_hf
from hookedattn.core.hub._names import official_name, tl_model_names
from hookedattn.core.hub._resolve import KINDS, Resolved, resolve

__all__ = [
    "KINDS",
    "DownloadInterruptedError",
    "GatedModelError",
    "HubError",
    "HubOptions",
    "ModelNotFoundError",
    "NoWeightsError",
    "NotCachedError",
    "Resolved",
    "RevisionNotFoundError",
    "load_model",
    "official_name",
    "resolve",
    "resolve_hf",
    "snapshot",
    "tl_model_names",
]
