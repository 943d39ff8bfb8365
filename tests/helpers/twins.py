"""Tiny random transformers twins and how far our numbers are from theirs, for the import
tests of single architectures (`tests/hf/test_hf_*.py`)."""

import torch
from torch import nn

from hookedattn.core.hf import _tiny


def tiny_twin(model_type: str, seed: int = 0, **fields) -> nn.Module:
    """A tiny random model of `model_type` (its registered causal-LM class), `fields` set on
    its config, shrunk as the verification on load shrinks it."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type, **fields))
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    return _tiny.random_hf_model(model_class, config, seed=seed)


def relative_worst(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest `|got - want|`, over the largest `|want|`."""
    return float((got - want).abs().max()) / float(want.abs().max())
