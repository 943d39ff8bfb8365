"""What a released SAE's names say: its hook point, width and kind, read off its release's
format, repo id, SAE id and folder (SAELens's registry names no hooks).

One home for these rules: `scripts/sae_releases.py` writes them into `releases.json`, and
`register_sae_release` applies them to releases registered at run time.

- Gemma Scope (`gemma_scope`, SAELens's `gemma_2` loader): the repo's last word is the site
  (`google/gemma-scope-2b-pt-res`: `res`, `mlp`, `att`), the folder the layer and width
  (`layer_12/width_16k/average_l0_82`): `blocks.12.hook_resid_post`, `blocks.12.hook_mlp_out`,
  `blocks.12.attn.hook_z` (the heads' z, flattened); `embedding/...` is `hook_embed`.
- Gemma Scope 2 (`gemma_scope_2`, SAELens's `gemma_3`): the folder's first part is the site
  (`resid_post/layer_17_width_16k_l0_big`, `mlp_out`, `attn_out`, `transcoder`, each also
  `..._all`).
- Everything else: the SAE id, when it starts with a hook name (`blocks.8.hook_resid_pre_768`
  is at `blocks.8.hook_resid_pre`); else none.

Widths are read off `width_16k` (16,384 features: k is 1,024, m is 1,024²).
"""

import re

_GEMMA_SITES = {"res": "hook_resid_post", "mlp": "hook_mlp_out", "att": "attn.hook_z"}
_GEMMA_2_SITES = {"resid_post": "hook_resid_post", "mlp_out": "hook_mlp_out",
                  "attn_out": "attn.hook_z"}  # fmt: skip
_HOOK_PREFIX = re.compile(
    r"(blocks\.\d+\.(?:[a-z0-9_]+\.)*hook_[a-z]+(?:_[a-z]+)*|hook_embed|hook_pos_embed)"
)
_LAYER = re.compile(r"layer_(\d+)")
_WIDTH = re.compile(r"width_(\d+)([km])(?![a-z])")
# Our name for the files of each SAELens loader (`conversion_func`; None is SAELens's own
# folder layout); a loader not named here keeps SAELens's name.
FORMATS = {None: "saelens", "gemma_2": "gemma_scope", "gemma_3": "gemma_scope_2"}
# SAELens's conversions that read transcoders, not SAEs.
TRANSCODER_CONVERSIONS = ("gemma_2_transcoder", "mwhanna_transcoder", "mntss_clt_layer_transcoder")


def format_of(conversion: str | None) -> str:
    """Our name for the files SAELens's loader `conversion` reads."""
    return FORMATS.get(conversion, conversion)


def hook_name(format: str, repo_id: str, sae_id: str, path: str) -> str | None:
    """The hook point an SAE of this release reads, or None where its names do not say."""
    if format == "gemma_scope":
        site = repo_id.rsplit("-", 1)[-1]
        if path.startswith("embedding/") and site == "res":
            return "hook_embed"
        return _in_block(_GEMMA_SITES.get(site), path)
    if format == "gemma_scope_2":
        return _in_block(_GEMMA_2_SITES.get(path.split("/")[0].removesuffix("_all")), path)
    match = _HOOK_PREFIX.match(sae_id)
    return match.group(1) if match else None


def width(path: str) -> int | None:
    """The number of features a Gemma Scope folder name gives (`width_16k`: 16,384)."""
    match = _WIDTH.search(path)
    if match is None:
        return None
    return int(match.group(1)) * (1024 if match.group(2) == "k" else 1024**2)


def kind(conversion: str | None, paths: list[str]) -> str:
    """`"transcoder"` for a release of transcoders, else `"sae"`."""
    if conversion in TRANSCODER_CONVERSIONS:
        return "transcoder"
    if conversion == "gemma_3" and any(p.split("/")[0].startswith("transcoder") for p in paths):
        return "transcoder"
    return "sae"


def _in_block(site: str | None, path: str) -> str | None:
    layer = _LAYER.search(path)
    if site is None or layer is None:
        return None
    return f"blocks.{int(layer.group(1))}.{site}"
