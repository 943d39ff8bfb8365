"""The HuggingFace importer's former home, kept so that `hookedattn.hf_import.from_hf` (and
the GPT-2 helpers) still resolve; the code lives in `hookedattn.hf`."""

from hookedattn.hf import SUPPORTED_ARCHITECTURES, convert_gpt2_state_dict, from_hf, gpt2_config

__all__ = ["SUPPORTED_ARCHITECTURES", "convert_gpt2_state_dict", "from_hf", "gpt2_config"]
