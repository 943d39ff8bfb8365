"""Import HuggingFace `transformers` models as HookedTransformers, exactly.

    model = HookedTransformer.from_hf(hf_model)          # a live GPT2LMHeadModel, LlamaFor...
    model = HookedTransformer.from_hf("path/to/dir", dtype=torch.bfloat16)   # local files

One small private module per family written out (`_gpt2`, `_openai_gpt`, `_gemma4`,
`_gpt_oss` sharing `_moe` with `_deepseek` for latent attention, `_diffllama`,
`_mimo_v2_flash`, `_minimax`, `_jetmoe`, `_falcon_h1`, `_nemotron_h`, `_indexer`; the Llama
table several extend in `_llama`, Gemma's constants in `_gemma`), each a config translation
and a table of tensor renames and reshapes (`Rule`, `Table`): what the convention cannot
see (GPT-2's `Conv1D`, GPT-OSS's clamped experts, latent attention, DiffLlama's
differential attention, MiMo-V2-Flash's attention shaped per block, Gemma 4's per-block
heads, value norms, block scalars and per-layer inputs, DeepSeek V3.2's lightning indexer,
the hybrids' layouts).
Every other architecture is imported by convention (`_anatomy` recognises its pieces by
watching its tiny twin run, `_split_layers` BERT's layout of them, `_probes` what each piece
computes, `_experts` its mixture of experts, `_saved` the names its files use, `_convention`
derives its family from them, and the verification decides among the candidates).
`_importer` runs the same steps for every family and `_loading` reads a directory's
safetensors files tensor by tensor.
What is exported below is the package's API; the modules are its machinery. Nothing here
assumes random weights: the same route loads real checkpoints for whoever has them locally.
`transformers` is an optional extra (`pip install hookedattn[hf]`), used to read configs,
tokenizers and the live models passed in, and to build the tiny twins the verification and
the convention run.

A directory is verified before its weights are read (`_verify`): a tiny twin of the
checkpoint (`_tiny`: its config's class and structure, few layers, small widths, random
weights) runs in `transformers` and through the family's import, and the first hook point
where they part refuses the load (`VerificationError`); a pass is remembered per kind of
checkpoint (`Verification`). `register_family` adds a family of one's own (or replaces a
built-in one), verified the same way.
"""

from hookedattn.core.hf._family import Family
from hookedattn.core.hf._gpt2 import convert_gpt2_state_dict, gpt2_config
from hookedattn.core.hf._importer import (
    FAMILIES,
    SUPPORTED_ARCHITECTURES,
    family_of_folder,
    from_hf,
    register_family,
    unregister_family,
)
from hookedattn.core.hf._table import Rule, Table
from hookedattn.core.hf._verify import Verification, VerificationError

__all__ = [
    "FAMILIES",
    "SUPPORTED_ARCHITECTURES",
    "Family",
    "Rule",
    "Table",
    "Verification",
    "VerificationError",
    "convert_gpt2_state_dict",
    "family_of_folder",
    "from_hf",
    "gpt2_config",
    "register_family",
    "unregister_family",
]
