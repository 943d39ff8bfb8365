"""Sparse autoencoders: dictionaries of features, spliced into a model exactly.

    sae = train_sae(store, "blocks.1.hook_resid_pre", d_sae=512, l1=1.0, steps=2000)
    # or k=16 (TopK), l0=0.1 (JumpReLU); resample_every=250 revives dead features
    sae.save("sae/"); sae = SparseAutoencoder.load("sae/")   # SAELens's layout
    sae = SparseAutoencoder.from_pretrained("gpt2-small-res-jb", "blocks.8.hook_resid_pre")
    list_sae_releases(model="gemma-2-2b", hook="blocks.12.hook_resid_post")  # SAELens's names
    with model.saes([sae]):                       # spliced at its hook point, removed after
        logits, cache = model.run_with_cache(tokens)
    handle = splice(model, [sae]); ...; handle.remove()   # the same, without a `with`
    cache["blocks.1.hook_resid_pre.sae.hook_acts"]   # [batch pos d_sae]
    print(evaluate_sae(model, sae, tokens))        # L0, FVE, dead, CE loss recovered

Transcoders (MLP input -> MLP output) and the replacement model built from them:

    tc = train_transcoder(store, 0, d_sae=1024, k=16, skip=True, steps=2000)  # or l1=, l0=
    clt = train_cross_layer_transcoder(store, 2, d_sae=1024, k=16, steps=2000)
    tcs = TranscoderSet.from_pretrained("gemma")   # circuit-tracer's preset, or a repo id
    with replaced(model, [tc0, tc1]):              # or replaced(model, clt), or (model, tcs)
        logits, cache = model.run_with_cache(tokens)    # the model's logits, to rounding
    cache["blocks.0.transcoder.hook_acts"]          # [batch pos d_sae]
    print(evaluate_transcoders(model, [tc0, tc1], tokens))  # L0, FVE, CE recovered per layer

Axes: `d_in` (the width of the hook point the SAE reads), `d_sae` (its features), `d_out`
(the width a transcoder writes), `layer_out` (the layers a cross-layer feature writes to).
"""

from hookedattn.core.model import HookedTransformer
from hookedattn.sae.autoencoder import HOOK_NAMES, SparseAutoencoder
from hookedattn.sae.config import SAEConfig
from hookedattn.sae.cross_layer import CrossLayerTranscoder
from hookedattn.sae.evaluation import SAEEvaluation, evaluate_sae
from hookedattn.sae.feature_examples import feature_examples
from hookedattn.sae.releases import (
    ReleasedSAE,
    list_sae_releases,
    register_sae_release,
    register_transcoder_preset,
    registry_source,
    transcoder_presets,
    unregister_sae_release,
    unregister_transcoder_preset,
)
from hookedattn.sae.replacement import replaced, transcoder_hook_name
from hookedattn.sae.shipped import list_pretrained_saes, load_pretrained_sae, pretrained_sae_record
from hookedattn.sae.shipped_transcoders import (
    list_pretrained_transcoders,
    load_pretrained_transcoders,
    pretrained_transcoders_record,
)
from hookedattn.sae.splice import Splice, sae_hook_name, splice, spliced
from hookedattn.sae.training import TrainingStep, fraction_of_variance_explained, train_sae
from hookedattn.sae.transcoder import TRANSCODER_HOOK_NAMES, LinearSkip, NoSkip, Transcoder
from hookedattn.sae.transcoder_config import CrossLayerTranscoderConfig, TranscoderConfig
from hookedattn.sae.transcoder_evaluation import (
    LayerEvaluation,
    TranscoderEvaluation,
    evaluate_transcoders,
)
from hookedattn.sae.transcoder_files import load_transcoder_set, save_transcoder_set
from hookedattn.sae.transcoder_set import TranscoderSet
from hookedattn.sae.transcoder_training import train_cross_layer_transcoder, train_transcoder

# `model.saes(...)` splices through this package; the core never imports it, so it is
# registered here (and `import hookedattn` imports this package).
HookedTransformer.sae_splicer = staticmethod(spliced)

__all__ = [
    "HOOK_NAMES",
    "SAEConfig",
    "SAEEvaluation",
    "SparseAutoencoder",
    "Splice",
    "TrainingStep",
    "evaluate_sae",
    "fraction_of_variance_explained",
    "list_pretrained_saes",
    "list_sae_releases",
    "load_pretrained_sae",
    "pretrained_sae_record",
    "register_sae_release",
    "sae_hook_name",
    "splice",
    "spliced",
    "train_sae",
    "unregister_sae_release",
]

# by name from the hub: SAELens's releases, circuit-tracer's transcoder sets
__all__ += [
    "ReleasedSAE",
    "register_transcoder_preset",
    "registry_source",
    "transcoder_presets",
    "unregister_transcoder_preset",
]

# transcoders, the replacement model, and their files
__all__ += [
    "TRANSCODER_HOOK_NAMES",
    "CrossLayerTranscoder",
    "CrossLayerTranscoderConfig",
    "LayerEvaluation",
    "LinearSkip",
    "NoSkip",
    "Transcoder",
    "TranscoderConfig",
    "TranscoderEvaluation",
    "TranscoderSet",
    "evaluate_transcoders",
    "feature_examples",
    "list_pretrained_transcoders",
    "load_pretrained_transcoders",
    "load_transcoder_set",
    "pretrained_transcoders_record",
    "replaced",
    "save_transcoder_set",
    "train_cross_layer_transcoder",
    "train_transcoder",
    "transcoder_hook_name",
]
