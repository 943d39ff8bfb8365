"""What `from_hf` knows about one HF model family: which classes and model types it covers,
how its config becomes ours, and the table that converts its tensors."""

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._table import Table


@dataclasses.dataclass(frozen=True)
class Family:
    """One importable family. `fields` reads the HF config (`transformers`'
    `PretrainedConfig`) into our config's fields, raising for a variant we cannot express;
    `table` reads it too, and is also given the live HF model when there is one (None for a
    directory), for the constants it keeps outside its state dict."""

    architecture: str  # the HF class with the unembedding, e.g. "LlamaForCausalLM"
    model_type: str  # `config.model_type`, e.g. "llama"
    fields: Callable[[Any], dict[str, Any]]
    table: Callable[[Any, HookedTransformerConfig, Any], Table]
    # What else the translation depends on (the recognised anatomy of a family derived by
    # convention, `_convention`); part of the key a verification is remembered under.
    variant: str = ""
    # A candidate's settings that the anatomy could not see (`_candidates.candidates`), as
    # (name, value) pairs; the candidate search (`_search`) moves between candidates that
    # differ in one of them.
    choices: tuple[tuple[str, Any], ...] = ()

    def config(
        self, hf_config: Any, dtype: torch.dtype | str = torch.float32, device: str = "cpu"
    ) -> HookedTransformerConfig:
        """Our config for an HF config of this family, in `dtype` on `device`."""
        return HookedTransformerConfig(
            **self.fields(hf_config),
            dtype=dtype,
            device=device,
            # The name a config was loaded from, else its model type.
            model_name=getattr(hf_config, "name_or_path", "") or hf_config.model_type,
            original_architecture=self.architecture,
        )


def tied_unembedding(hf_config: Any, embedding: str) -> dict[str, tuple[str, ...]]:
    """`lm_head.weight` may be absent from a file when it is the embedding (HF saves a tied
    tensor once): then it is read from `embedding`."""
    if getattr(hf_config, "tie_word_embeddings", False):
        return {"lm_head.weight": (embedding,)}
    return {}
