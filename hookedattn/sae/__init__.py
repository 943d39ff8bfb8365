"""Sparse autoencoders: dictionaries of features, spliced into a model exactly.

    sae = train_sae(store, "blocks.1.hook_resid_pre", d_sae=512, l1=1.0, steps=2000)
    # or k=16 (TopK), l0=0.1 (JumpReLU); resample_every=250 revives dead features
    sae.save("sae/"); sae = SparseAutoencoder.load("sae/")   # SAELens's layout
    with model.saes([sae]):                       # spliced at its hook point, removed after
        logits, cache = model.run_with_cache(tokens)
    cache["blocks.1.hook_resid_pre.sae.hook_acts"]   # [batch pos d_sae]
    print(evaluate_sae(model, sae, tokens))        # L0, FVE, dead, CE loss recovered

Axes: `d_in` (the width of the hook point the SAE reads), `d_sae` (its features).
"""

from hookedattn.core.model import HookedTransformer
from hookedattn.sae.autoencoder import HOOK_NAMES, SparseAutoencoder
from hookedattn.sae.config import SAEConfig
from hookedattn.sae.evaluation import SAEEvaluation, evaluate_sae
from hookedattn.sae.shipped import list_pretrained_saes, load_pretrained_sae, pretrained_sae_record
from hookedattn.sae.splice import sae_hook_name, spliced
from hookedattn.sae.training import TrainingStep, fraction_of_variance_explained, train_sae

# `model.saes(...)` splices through this package; the core never imports it, so it is
# registered here (and `import hookedattn` imports this package).
HookedTransformer.sae_splicer = staticmethod(spliced)

__all__ = [
    "HOOK_NAMES",
    "SAEConfig",
    "SAEEvaluation",
    "SparseAutoencoder",
    "TrainingStep",
    "evaluate_sae",
    "fraction_of_variance_explained",
    "list_pretrained_saes",
    "load_pretrained_sae",
    "pretrained_sae_record",
    "sae_hook_name",
    "spliced",
    "train_sae",
]
