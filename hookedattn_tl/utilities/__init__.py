"""TransformerLens 3.x's `utilities` package: `utils`' functions, and the submodules TL code
imports (`cache`, `attention`, `hf_utils`)."""

from hookedattn_tl.utilities import activation_functions, attention, cache, hf_utils
from hookedattn_tl.utilities.activation_functions import SUPPORTED_ACTIVATIONS, gelu_fast, solu
from hookedattn_tl.utilities.attention import complex_attn_linear, simple_attn_linear
from hookedattn_tl.utilities.cache import get_pos_offset
from hookedattn_tl.utils import (
    Slice,
    SliceInput,
    get_act_name,
    get_attention_mask,
    get_corner,
    lm_cross_entropy_loss,
    remove_batch_dim,
    test_prompt,
    to_numpy,
    transpose,
)

__all__ = [
    "SUPPORTED_ACTIVATIONS",
    "Slice",
    "SliceInput",
    "activation_functions",
    "attention",
    "cache",
    "complex_attn_linear",
    "gelu_fast",
    "get_act_name",
    "get_attention_mask",
    "get_corner",
    "get_pos_offset",
    "hf_utils",
    "lm_cross_entropy_loss",
    "remove_batch_dim",
    "simple_attn_linear",
    "solu",
    "test_prompt",
    "to_numpy",
    "transpose",
]
