"""SAEs and transcoders by name, from the Hugging Face hub: SAELens's release registry and
circuit-tracer's transcoder sets.

    sae = SparseAutoencoder.from_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")
    sae = SparseAutoencoder.from_pretrained("gemma-scope-2b-pt-res-canonical",
                                            "layer_12/width_16k/canonical")   # params.npz
    list_sae_releases(model="gemma-2-2b", hook="blocks.12.hook_resid_post")
    tcs = TranscoderSet.from_pretrained("gemma")        # circuit-tracer's preset, or a repo id

The registry (`releases.json`, SAELens's `pretrained_saes.yaml` converted by
`scripts/sae_releases.py`) says which repo and folder hold each SAE and in which files;
only that SAE's files are fetched, through `hookedattn.core.hub` (its cache, tokens,
revisions, offline mode and errors). `register_sae_release` and
`register_transcoder_preset` add names in this process.
"""

from hookedattn.sae.releases._registry import (
    LOADABLE,
    ReleasedSAE,
    list_sae_releases,
    register_sae_release,
    registry_source,
    unregister_sae_release,
)
from hookedattn.sae.releases._transcoders import (
    register_transcoder_preset,
    transcoder_presets,
    unregister_transcoder_preset,
)

__all__ = [
    "LOADABLE",
    "ReleasedSAE",
    "list_sae_releases",
    "register_sae_release",
    "register_transcoder_preset",
    "registry_source",
    "transcoder_presets",
    "unregister_sae_release",
    "unregister_transcoder_preset",
]
