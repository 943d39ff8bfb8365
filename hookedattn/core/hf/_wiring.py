"""How a decoder layer's pieces connect, read off the tensors its twin's run passed.

A norm whose output a sublayer reads is that sublayer's pre-norm (`ln1`, `ln2`); one whose
input is a sublayer's output is its post-norm (`ln1_post`, `ln2_post`); the MLP reading the
stream the attention read makes the block parallel; and what each sublayer adds to the
stream, divided by what it computed, is the scalar its write is multiplied by. Norms that
read the stream plus a sublayer's write are post-residual norms (GPT-1's, BERT's, BART's:
`ln_resid_mid` after the attention's add, whose output the MLP reads, and `ln_resid_post`
after the MLP's, whose output leaves the layer).
"""

import torch
from torch import Tensor

from hookedattn.core.hf._probes import ratio


def wiring(
    calls: list[tuple[str, Tensor, Tensor]], attn: str, mlp: str, norm_names: list[str]
) -> tuple[list[tuple[str, str]], bool, tuple[float, float]]:
    """Our norm names for the layer's norms, whether the block is parallel, and the scalar
    each sublayer's write is multiplied by, from the tensors the calls passed."""
    (_, resid, out), *pieces = _as_stream(calls)
    called = {name: (x, y) for name, x, y in pieces}
    if attn not in called or mlp not in called:
        raise ValueError("the twin's first layer did not call both its sublayers")
    attn_in, attn_out = called[attn]
    mlp_in, mlp_out = called[mlp]
    post_residual = _post_residual(called, resid, out, attn_out, mlp_in, mlp_out, norm_names)
    if post_residual is not None:
        return post_residual, False, (1.0, 1.0)
    norms = []
    for name in norm_names:
        if name not in called:
            raise ValueError(f"the norm {name} is never called")
        x, y = called[name]
        if y is attn_in:
            norms.append(("ln1", name))
        if y is mlp_in:
            norms.append(("ln2", name))
        if x is attn_out and y is not mlp_in:  # else: the stream, BLOOM's (below)
            norms.append(("ln1_post", name))
        if x is mlp_out:
            norms.append(("ln2_post", name))
        if not any(hf == name for _, hf in norms):
            raise ValueError(f"the norm {name} neither feeds a sublayer nor reads its output")
    ours = dict(norms)
    written_attn = called[ours["ln1_post"]][1] if "ln1_post" in ours else attn_out
    written_mlp = called[ours["ln2_post"]][1] if "ln2_post" in ours else mlp_out
    reads = called[ours["ln2"]][0] if "ln2" in ours else mlp_in
    # A sublayer that adds the stream to its write itself (BLOOM's attention and MLP, MPT's
    # MLP: `residual` is one of their inputs): the stream after it is its own output.
    if reads is attn_out and "ln1_post" not in ours:
        written_attn = attn_out - resid
    if out is mlp_out and "ln2_post" not in ours:
        written_mlp = mlp_out - reads
    parallel = (
        reads is resid
        or (reads is attn_in and "ln1" in ours)
        or bool("ln2" in ours and ours["ln2"] == ours.get("ln1"))
    )
    if parallel:  # out = resid + a A + m M: both scalars from one least-squares fit
        basis = torch.stack([written_attn.flatten(), written_mlp.flatten()], dim=1).double()
        fit = torch.linalg.lstsq(basis, (out - resid).flatten().double()[:, None]).solution
        scales = (float(fit[0]), float(fit[1]))
        rebuilt = resid + scales[0] * written_attn + scales[1] * written_mlp
    else:
        scales = (
            ratio(reads - resid, written_attn, "what the attention adds to the stream"),
            ratio(out - reads, written_mlp, "what the MLP adds to the stream"),
        )
        rebuilt = resid + scales[0] * written_attn + scales[1] * written_mlp
    if not torch.allclose(rebuilt.double(), out.double(), rtol=1e-4, atol=1e-6):
        raise ValueError("the layer's output is not its input plus what its sublayers write")
    return norms, parallel, scales


def _as_stream(calls: list[tuple[str, Tensor, Tensor]]) -> list[tuple[str, Tensor, Tensor]]:
    """`calls` with each tensor the stream's size but not its shape (OPT's MLP reads the
    stream flattened to `[batch * pos, d_model]`) viewed in the stream's shape; one tensor
    passed twice stays one object, so that who read what is still told by identity."""
    shape = calls[0][1].shape
    viewed: dict[int, Tensor] = {}

    def view(t: Tensor) -> Tensor:
        if t.shape == shape or t.numel() != shape.numel():
            return t
        return viewed.setdefault(id(t), t.reshape(shape))

    return [(name, view(x), view(y)) for name, x, y in calls]


def _post_residual(
    called: dict[str, tuple[Tensor, Tensor]],
    resid: Tensor,
    out: Tensor,
    attn_out: Tensor,
    mlp_in: Tensor,
    mlp_out: Tensor,
    norm_names: list[str],
) -> list[tuple[str, str]] | None:
    """The layer's two norms as `ln_resid_mid` and `ln_resid_post` where they norm the
    stream after each add (one reads `resid + attn_out` and feeds the MLP, the other reads
    that plus `mlp_out` and is the layer's output); None where they do not."""

    def same(a: Tensor, b: Tensor) -> bool:
        return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6)

    mid = [n for n in norm_names if n in called and same(called[n][0], resid + attn_out)
           and same(called[n][1], mlp_in)]  # fmt: skip
    if len(norm_names) != 2 or len(mid) != 1:
        return None
    (post,) = [n for n in norm_names if n != mid[0]]
    x, y = called.get(post, (None, None))
    if x is None or not same(x, mlp_in + mlp_out) or not same(y, out):
        return None
    return [("ln_resid_mid", mid[0]), ("ln_resid_post", post)]


def placement(ours: set[str]) -> str:
    """ "pre", "post" or "pre_and_post" for the set of our norm names a layer holds."""
    for placement, names in (("pre", {"ln1", "ln2"}), ("post", {"ln1_post", "ln2_post"}),
                             ("pre_and_post", {"ln1", "ln2", "ln1_post", "ln2_post"}),
                             ("post_residual", {"ln_resid_mid", "ln_resid_post"})):  # fmt: skip
        if ours == names:
            return placement
    raise ValueError(
        f"norms at {sorted(ours)}: not one of pre, post, pre-and-post or post-residual norms"
    )
