"""circuit-tracer's names in a transcoder set's `config.yaml`: its kinds and its hooks.

circuit-tracer names a set's hooks within a block, in TransformerLens's terms plus the two
hook points its replacement model wraps around each MLP (`ReplacementMLP`; for nnsight,
`circuit_tracer.utils.tl_nnsight_mapping`): `mlp.hook_in`, the MLP's input, and
`mlp.hook_out`, its output. Ours:

    circuit-tracer        ours
    mlp.hook_in           ln2.hook_out       the MLP's input, after the norm's gain (exact)
    mlp.hook_out          hook_mlp_out       the MLP's output (exact where no norm follows
                                             the MLP, as in Llama and Qwen 3, the models
                                             whose sets name it; after such a norm ours is)
    ln2.hook_normalized   ln2.hook_normalized   before the gain, as TransformerLens 3
    hook_resid_mid        hook_resid_mid
    hook_mlp_out          hook_mlp_out

Reading maps their names to ours; writing maps `ln2.hook_out` to `mlp.hook_in` (a name
TransformerLens's blocks lack) and keeps the others, which circuit-tracer's backends know.
"""

import re

# `model_kind` in a `config.yaml` (circuit-tracer 0.2 on): what `load_transcoders` reads.
PER_LAYER = "transcoder_set"
CROSS_LAYER = "cross_layer_transcoder"

_THEIRS_TO_OURS = {"mlp.hook_in": "ln2.hook_out", "mlp.hook_out": "hook_mlp_out"}
_OURS_TO_THEIRS = {"ln2.hook_out": "mlp.hook_in"}


def ours(hook: str) -> str:
    """Our name within a block for circuit-tracer's `hook` (module docstring)."""
    return _THEIRS_TO_OURS.get(hook, hook)


def theirs(hook: str) -> str:
    """circuit-tracer's name within a block for our `hook` (module docstring)."""
    return _OURS_TO_THEIRS.get(hook, hook)


def within_block(hook_name: str) -> str:
    """`blocks.3.ln2.hook_out` -> `ln2.hook_out` (circuit-tracer names hooks within a block)."""
    match = re.fullmatch(r"blocks\.\d+\.(.+)", hook_name)
    if match is None:
        raise ValueError(f"expected a hook name inside a block (blocks.L....), got {hook_name!r}")
    return match.group(1)
