"""How a `HookedTransformer` is written and read: the model's I/O methods, in one place.

    model.save(path)                                 safetensors + config.json, no pickle
    HookedTransformer.load(path)                     what `save` wrote
    HookedTransformer.from_pretrained(name)          by name: shipped, folder, hub, TL name
    HookedTransformer.from_hf(model_or_name)         a transformers causal LM, verified

The work is done elsewhere (`_weights_io`, `hub`, `hf`); these are the methods researchers
call, with the options each takes. `HookedTransformer` inherits them (`ModelIO`).
"""

import os
from pathlib import Path
from typing import Any

import torch

from hookedattn.core import _weights_io, hf, hub


class ModelIO:
    """`save`, `load`, `from_pretrained` and `from_hf` of a `HookedTransformer`."""

    def save(self, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
        """Write `model.safetensors` and `config.json` into the directory `path`; `metadata`
        (JSON-serialisable) is kept in `config.json` beside the config (`read_config`)."""
        return _weights_io.save(self, path, metadata=metadata)

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        *,
        tp_size: int | None = None,
        device_map: Any = None,
        max_memory: Any = None,
    ) -> Any:
        """Rebuild a model saved with `save` (no pickle: loading cannot run code).

        Weights load in the dtype the checkpoint's config names; `dtype=` converts them
        (the only way a float width changes on load). `tp_size` and `device_map` as in
        `from_hf`.
        """
        placement = dict(tp_size=tp_size, device_map=device_map, max_memory=max_memory)
        return _weights_io.load(cls, path, device=device, dtype=dtype, **placement)

    @classmethod
    def from_pretrained(
        cls,
        model_name: str | os.PathLike,
        *,
        checkpoint_index: int | None = None,
        checkpoint_value: int | None = None,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        tokenizer: Any = None,
        dtype: torch.dtype | str | None = None,
        device: str | None = None,
        tp_size: int | None = None,
        device_map: Any = None,
        max_memory: Any = None,
        verify: bool = True,
    ) -> Any:
        """Load a model by its name: a shipped model, a folder, a hub repo, a TL name.

        `model_name` is one of (`hookedattn.core.hub.resolve`):

        - a shipped model (`hookedattn.list_pretrained()`: package data, no network);
        - a folder written by `save`, by transformers' `save_pretrained`, or a
          TransformerLens toy model;
        - a hub repo id (`"EleutherAI/pythia-70m"`), at `revision` (a branch, tag or
          commit), fetched through `huggingface_hub` with `token` (default: the stored one)
          into `cache_dir` (default: `HF_HUB_CACHE`); only the files the import reads;
          `local_files_only=True` (or `HF_HUB_OFFLINE=1`) reads the cache alone;
        - one of TransformerLens's names or aliases (`"gpt2-small"`, `"pythia-70m"`,
          `"attn-only-2l"`: `hookedattn.core.hub.tl_model_names()`).

        `checkpoint_value` (a training step) or `checkpoint_index` picks a training
        checkpoint: a shipped model's, a Pythia or Stanford CRFM revision (`step1000`), or
        a TL toy model's checkpoint file. The weights load as stored unless `dtype` says
        otherwise; `tp_size`, `device_map` and `max_memory` place them as in `from_hf`.
        A `transformers` checkpoint is verified before its weights are read, as by
        `from_hf` (`verify=False` skips it).
        """
        options = hub.HubOptions(revision, token, cache_dir, local_files_only)
        return hub.load_model(
            cls,
            model_name,
            options,
            checkpoint_index=checkpoint_index,
            checkpoint_value=checkpoint_value,
            tokenizer=tokenizer,
            dtype=dtype,
            device=device,
            tp_size=tp_size,
            device_map=device_map,
            max_memory=max_memory,
            verify=verify,
        )

    @classmethod
    def from_hf(
        cls,
        hf_model: Any,
        *,
        tokenizer: Any = None,
        dtype: torch.dtype | str | None = None,
        device: str | None = None,
        tp_size: int | None = None,
        device_map: Any = None,
        max_memory: Any = None,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        verify: bool = True,
    ) -> Any:
        """Import a `transformers` causal LM: a live model, a folder, or a hub repo id.

        GPT-2, GPT-1, GPT-NeoX (Pythia), Llama, Mistral, Qwen 2 and 3, Gemma 2 and 3, OLMo 2, Phi-3,
        GPT-J, OPT, BERT and BART decoders, and the mixtures of experts Mixtral, Qwen2-MoE,
        Qwen3-MoE, OLMoE and GPT-OSS (`hookedattn.core.hf.SUPPORTED_ARCHITECTURES` and the
        convention). Needs the optional `transformers` (`pip install hookedattn[hf]`). A
        repo id (or a TransformerLens name) is fetched through `huggingface_hub` at
        `revision`, with `token`, into
        `cache_dir`, or read from the cache alone with `local_files_only=True`
        (`from_pretrained` says more). A folder is read from its safetensors files
        memory-mapped, a chunk at a time, converted to `dtype` as it is read, into a model
        built on the meta device (pickled `pytorch_model.bin` only with
        `torch.load(weights_only=True)`).

        Beyond one device (`hookedattn.core.parallel`): `tp_size=N` inside a `torchrun` job
        of N processes splits heads, neurons and the vocabulary over them, each rank
        reading only its slices; `device_map` ("auto", a list of devices, or a dict such as
        `{"blocks.0": "cuda:0", ...}`, with `max_memory={device: bytes}`) places whole
        blocks on devices.

        Verified on load: before a folder's (or a fetched repo's) weights are read, a tiny
        twin of the checkpoint (its config's class with every structural option, few
        layers, small widths, random weights) runs in `transformers` and through this
        import, compared at every layer's residual stream and the logits; where they part
        a `hookedattn.core.hf.VerificationError` names the hook point and by how much. A
        pass is remembered per kind of checkpoint (`~/.cache/hookedattn/verified.json`, or
        under `$XDG_CACHE_HOME`, or `$HOOKEDATTN_CACHE`), so the check costs about a second
        once and milliseconds after (the guide's "Verified on load"); `model.verification`
        records it. `verify=False` refuses nothing (where the import by convention leaves a
        choice, its twin still makes it); a live model of a family written out is not
        checked, one imported by convention is.
        """
        options = hub.HubOptions(revision, token, cache_dir, local_files_only)
        found = _hf_source(hf_model, options)
        placement = dict(tp_size=tp_size, device_map=device_map, max_memory=max_memory)
        source = hf_model if found is None else found.folder
        model = hf.from_hf(
            cls, source, tokenizer=tokenizer, dtype=dtype, device=device, verify=verify, **placement
        )
        model.source = found
        return model


def _hf_source(hf_model: Any, options: "hub.HubOptions") -> "hub.Resolved | None":
    """What `from_hf` was given by name, resolved (and fetched) with `options`; None for a
    live model, which takes no hub options."""
    if isinstance(hf_model, str | os.PathLike):
        return hub.resolve_hf(hf_model, options)
    if options != hub.HubOptions():
        raise ValueError(
            "revision, token, cache_dir and local_files_only choose what to fetch by "
            "name; a live transformers model has nothing to fetch"
        )
    return None
