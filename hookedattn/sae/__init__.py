"""Sparse autoencoders: dictionaries of features, spliced into a model exactly.

    sae = SparseAutoencoder(SAEConfig(d_in=64, d_sae=512, hook_name="blocks.1.hook_resid_pre"))
    with model.saes([sae]):                       # spliced at its hook point, removed after
        logits, cache = model.run_with_cache(tokens)
    cache["blocks.1.hook_resid_pre.sae.hook_acts"]   # [batch pos d_sae]

Axes: `d_in` (the width of the hook point the SAE reads), `d_sae` (its features).
"""

from hookedattn.sae.autoencoder import HOOK_NAMES, SparseAutoencoder
from hookedattn.sae.config import SAEConfig
from hookedattn.sae.splice import sae_hook_name, spliced

__all__ = ["HOOK_NAMES", "SAEConfig", "SparseAutoencoder", "sae_hook_name", "spliced"]
