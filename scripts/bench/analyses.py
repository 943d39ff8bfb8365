"""Analysis measures of `scripts/bench`, each against a bare plain-torch reference.

Every function returns a `Group`: the reference first, then hookedattn's call and, when a
TransformerLens model is given, its call on the same weights. `value(output)` maps each
output to numbers that must agree with the reference's before anything is timed.
"""

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from reference import BareTransformer, build
from settings import Setting
from torch import Tensor

from hookedattn import HookedTransformer

BARE, OURS, TL = "bare", "hookedattn", "transformer_lens"


@dataclasses.dataclass
class Entry:
    """One contender of a group: `fn()` is timed; `value(fn())` is checked."""

    measure: str
    contender: str
    fn: Callable[[], Any]
    value: Callable[[Any], Tensor] = lambda out: out


@dataclasses.dataclass
class Group:
    """Entries timed together; the first is the reference. Outputs agree to `rtol`."""

    entries: list[Entry]
    rtol: float = 1e-4

    def check(self) -> None:
        """Raise if any contender's numbers differ from the reference's."""
        ref = self.entries[0].value(self.entries[0].fn()).double()
        for e in self.entries[1:]:
            got = e.value(e.fn()).double()
            scale = ref.abs().max().clamp(min=1e-12)
            if got.shape != ref.shape or (got - ref).abs().max() > self.rtol * scale:
                raise AssertionError(f"{e.contender} {e.measure}: differs from the reference")


# ------------------------------------------------------------------ composition scores


def bare_composition_scores(model: HookedTransformer, kind: str) -> Tensor:
    """`||OV_1 @ M_2||_F / (||OV_1||_F ||M_2||_F)` for every earlier/later pair of heads.

    With `OV_1 = V O` and `M_2 = A B`: `||V O A B||_F = ||R_V O A R_B^T||_F` where `R` is the
    Cholesky factor of the `d_head x d_head` Gram matrix, so every pair costs one
    `d_head x d_model x d_head` product. Those products are the whole cost; nothing else
    could be skipped.
    """
    attn = [b.attn for b in model.blocks]
    W_V, W_O, W_Q, W_K = (
        torch.stack([getattr(a, w) for a in attn]) for w in ("W_V", "W_O", "W_Q", "W_K")
    )
    A, B = {"Q": (W_Q, W_K.mT), "K": (W_K, W_Q.mT), "V": (W_V, W_O)}[kind]
    written = torch.linalg.cholesky(W_V.mT @ W_V).mT @ W_O  # [layer head d_head d_model]
    read = A @ torch.linalg.cholesky(B @ B.mT)  # [layer head d_model d_head]
    written_norm, read_norm = (torch.linalg.matrix_norm(x) for x in (written, read))
    n_layers, n_heads = W_V.shape[:2]
    scores = torch.zeros(n_layers, n_heads, n_layers, n_heads)
    for layer in range(n_layers - 1):
        overlap = torch.einsum("hrd,lgds->hlgrs", written[layer], read[layer + 1 :])
        denominator = written_norm[layer][:, None, None] * read_norm[layer + 1 :]
        scores[layer, :, layer + 1 :] = torch.linalg.matrix_norm(overlap) / denominator
    return scores


def composition(model: HookedTransformer, tl: Any, kind: str = "Q") -> Group:
    """Composition scores of every head pair (`kind` Q, K or V), also on a first call."""
    from analysis.composition import _random_baseline, composition_scores

    def first_call() -> Any:  # as in a fresh process: the random baseline not memoised yet
        _random_baseline.cache_clear()
        return composition_scores(model, kind)

    measure = "composition scores, all head pairs"
    entries = [
        Entry(measure, BARE, lambda: bare_composition_scores(model, kind)),
        Entry(measure, OURS, lambda: composition_scores(model, kind), lambda out: out.scores),
        Entry(f"{measure}, first call (random baseline drawn)", OURS, first_call,
              lambda out: out.scores),
    ]  # fmt: skip
    if tl is not None:
        entries.append(Entry(measure, TL, lambda: tl.all_composition_scores(kind)))
    return Group(entries, rtol=1e-3)


# ------------------------------------------------------------------ factored SVD


def bare_full_ov_svd(model: HookedTransformer, layer: int, head: int) -> Tensor:
    """Singular values of `W_E W_V[h] W_O[h] W_U` from QR factors of its two thin factors."""
    attn = model.blocks[layer].attn
    A = model.embed.W_E @ attn.W_V[head]  # [d_vocab d_head]
    B = attn.W_O[head] @ model.unembed.W_U  # [d_head d_vocab_out]
    Q_a, R_a = torch.linalg.qr(A)
    Q_b, R_b = torch.linalg.qr(B.T)
    U, S, Vh = torch.linalg.svd(R_a @ R_b.T)
    return Q_a @ U, S, Q_b @ Vh.T


def factored_svd(model: HookedTransformer, tl: Any, layer: int = 0, head: int = 0) -> Group:
    """The singular values of one head's full OV circuit, from its factors."""
    from analysis.circuits import full_ov_circuit

    measure = "factored SVD of one OV circuit"
    entries = [
        Entry(measure, BARE, lambda: bare_full_ov_svd(model, layer, head), lambda out: out[1]),
        Entry(measure, OURS, lambda: full_ov_circuit(model, layer, head).svd(), lambda out: out.S),
    ]
    if tl is not None:
        entries.append(
            Entry(
                measure,
                TL,
                lambda: (tl.W_E @ tl.OV[layer, head] @ tl.W_U).svd(),
                lambda out: out[1],
            )
        )
    return Group(entries, rtol=1e-3)


# ------------------------------------------------------------------ decomposition


def bare_decomposition(model: HookedTransformer, cache: Any) -> Tensor:
    """Embeddings, every head's write, each layer's `b_O` and MLP output, stacked."""
    parts = [cache["hook_embed"][None], cache["hook_pos_embed"][None]]
    for layer, block in enumerate(model.blocks):
        z = cache[f"blocks.{layer}.attn.hook_z"]
        parts.append(torch.einsum("bphd,hdm->hbpm", z, block.attn.W_O))
        parts.append(block.attn.b_O.expand_as(parts[0]))
        if not model.cfg.attn_only:
            parts.append(cache[f"blocks.{layer}.hook_mlp_out"][None])
    return torch.cat(parts)


def decomposition(model: HookedTransformer, tl: Any, tokens: Tensor) -> Group:
    """The residual stream decomposed into embeddings, heads, biases and MLPs."""
    from analysis.decomposition import decompose_resid

    _, cache = model.run_with_cache(tokens)
    measure = "full residual decomposition (heads, biases, MLPs)"
    entries = [
        Entry(measure, BARE, lambda: bare_decomposition(model, cache), lambda out: out.sum(0)),
        Entry(
            measure,
            OURS,
            lambda: decompose_resid(model, cache, None, granularity="head"),
            lambda out: out.components.sum(0),
        ),
    ]
    if tl is not None:
        _, tl_cache = tl.run_with_cache(tokens)
        entries.append(
            Entry(
                measure,
                TL,
                lambda: tl_cache.get_full_resid_decomposition(expand_neurons=False),
                lambda out: out.sum(0),
            )
        )
    return Group(entries)


def head_results(model: HookedTransformer, tl: Any, tokens: Tensor) -> Group:
    """Every head's write to the residual stream, every layer, from a cache."""
    from analysis.head_results import head_results as ours

    _, cache = model.run_with_cache(tokens)
    layers = range(model.cfg.n_layers)
    measure = "head results, every layer"

    def bare() -> Tensor:
        return torch.stack(
            [
                torch.einsum("bphd,hdm->bphm", cache[f"blocks.{i}.attn.hook_z"], b.attn.W_O)
                for i, b in enumerate(model.blocks)
            ]
        )

    entries = [
        Entry(measure, BARE, bare, lambda out: out.sum(3)),
        Entry(
            measure,
            OURS,
            lambda: torch.stack([ours(model, cache, i) for i in layers]),
            lambda o: o.sum(3),
        ),
    ]
    if tl is not None:
        _, tl_cache = tl.run_with_cache(tokens)
        n_heads = model.cfg.n_heads
        entries.append(
            Entry(
                measure,
                TL,
                lambda: tl_cache.stack_head_results(layer=-1),
                lambda out: out.unflatten(0, (-1, n_heads)).sum(1),
            )
        )
    return Group(entries)


# ------------------------------------------------------------------ TL's cache methods

# hookedattn_tl's cache against TransformerLens's, the same call on the same weights; TL's
# row leads (the reference), so each ratio is ours over TL's in the same round.
TL_CACHE_METHODS = {
    "cache.stack_head_results(layer=-1)": lambda cache: cache.stack_head_results(layer=-1),
    "cache.decompose_resid()": lambda cache: cache.decompose_resid(),
    "cache.accumulated_resid()": lambda cache: cache.accumulated_resid(),
}
FIRST_STACK = "cache.stack_head_results(layer=-1), first call on the cache"


@functools.lru_cache(maxsize=1)
def _tl_caches(model: HookedTransformer, tl: Any, tokens: Tensor) -> tuple[Any, Any]:
    """Our facade's cache and TransformerLens's, each from its own forward on the weights."""
    import hookedattn_tl

    facade = hookedattn_tl.HookedTransformer(model.cfg)
    facade.load_state_dict(model.state_dict())
    facade.eval()
    return facade.run_with_cache(tokens)[1], tl.run_with_cache(tokens)[1]


def tl_cache_method(measure: str) -> Callable[..., Group | None]:
    """The group timing one of TL's cache methods, called again on one cache (as in a
    notebook: the head results are computed by the first call and kept in the cache)."""
    call = TL_CACHE_METHODS[measure]

    def make(model: HookedTransformer, tl: Any, tokens: Tensor) -> Group | None:
        if tl is None:
            return None
        ours, theirs = _tl_caches(model, tl, tokens)
        return Group(
            [Entry(measure, TL, lambda: call(theirs)), Entry(measure, OURS, lambda: call(ours))]
        )

    return make


def tl_first_stack(model: HookedTransformer, tl: Any, tokens: Tensor) -> Group | None:
    """`stack_head_results` on a cache without head results yet (they are computed)."""
    if tl is None:
        return None
    from transformer_lens import ActivationCache as Theirs

    from hookedattn_tl import ActivationCache as Ours

    ours, theirs = _tl_caches(model, tl, tokens)
    recorded = {name: dict(c.cache_dict) for name, c in (("ours", ours), ("theirs", theirs))}
    for entries in recorded.values():
        for name in [n for n in entries if n.endswith("attn.hook_result")]:
            del entries[name]

    def first(cache_type: type, entries: dict, owner: Any) -> Callable[[], Tensor]:
        return lambda: cache_type(dict(entries), owner).stack_head_results(layer=-1)

    return Group(
        [
            Entry(FIRST_STACK, TL, first(Theirs, recorded["theirs"], tl)),
            Entry(FIRST_STACK, OURS, first(Ours, recorded["ours"], ours.model)),
        ]
    )


_TL_GROUPS = (
    *[
        (f"TL's {measure}", "hookedattn_tl.ActivationCache", tl_cache_method(measure))
        for measure in TL_CACHE_METHODS
    ],
    ("TL's stack_head_results, first call", "hookedattn_tl.ActivationCache", tl_first_stack),
)


# ------------------------------------------------------------------ patching


def patching(model: HookedTransformer, tl: Any, clean: Tensor, corrupted: Tensor) -> Group:
    """Patch every head's `z` at every position from the clean run into the corrupted one."""
    from analysis.patching import activation_patch

    answer, wrong = clean[:, -1], corrupted[:, -1]

    def metric(logits: Tensor) -> Tensor:  # logit difference at the last position, per prompt
        last = logits[:, -1]
        return last.gather(1, answer[:, None])[:, 0] - last.gather(1, wrong[:, None])[:, 0]

    _, clean_cache = model.run_with_cache(clean, names_filter=lambda n: n.endswith("hook_z"))

    def loop() -> Tensor:
        return _patching_loop(model, corrupted, clean_cache, metric)

    measure = "activation patching, every head x position"
    prompts = dict(clean_tokens=clean, corrupted_tokens=corrupted, metric=metric)
    entries = [
        Entry(f"{measure} (loop: one forward per patch)", OURS, loop),
        Entry(
            measure,
            OURS,
            lambda: activation_patch(model, "z", **prompts, by_pos=True),
            lambda out: out.per_prompt.mean(-1),
        ),
    ]
    if "metric_positions" in inspect.signature(activation_patch).parameters:
        # The metric reads the last position only; declared, the passes compute only that.
        entries.append(
            Entry(
                f"{measure}, metric_positions=-1",
                OURS,
                lambda: activation_patch(model, "z", **prompts, by_pos=True, metric_positions=-1),
                lambda out: out.per_prompt.mean(-1),
            )
        )
    if tl is not None:
        entries.append(_tl_patching(tl, clean, corrupted, metric, measure))
    return Group(entries, rtol=1e-3)


def _patching_loop(
    model: HookedTransformer, corrupted: Tensor, clean_cache: Any, metric: Any
) -> Tensor:
    """The definition: one forward per (layer, position, head), `[layer pos head]`."""
    n_layers, n_heads, n_pos = model.cfg.n_layers, model.cfg.n_heads, corrupted.shape[1]
    out = torch.empty(n_layers, n_pos, n_heads)
    for layer in range(n_layers):
        name = f"blocks.{layer}.attn.hook_z"
        for pos in range(n_pos):
            for head in range(n_heads):

                def patch(z: Tensor, hook: Any, pos: int = pos, head: int = head) -> Tensor:
                    z[:, pos, head] = clean_cache[hook.name][:, pos, head]
                    return z

                logits = model.run_with_hooks(corrupted, fwd_hooks=[(name, patch)])
                out[layer, pos, head] = metric(logits).mean()
    return out


def _tl_patching(tl: Any, clean: Tensor, corrupted: Tensor, metric: Any, measure: str) -> Entry:
    """TransformerLens's own sweep of the same patches, on the same weights."""
    from transformer_lens import patching as tl_patching

    tl_patching.tqdm = lambda items, **kwargs: items  # no progress bar in the timing
    _, tl_clean = tl.run_with_cache(clean)
    return Entry(
        measure,
        TL,
        lambda: tl_patching.get_act_patch_attn_head_out_by_pos(
            tl, corrupted, tl_clean, lambda logits: metric(logits).mean()
        ),
    )


# ------------------------------------------------------------------ circuit discovery

IG_STEPS, ACDC_THRESHOLD = 5, 0.1


def discovery_prompts(model: HookedTransformer, batch: int, pos: int) -> dict:
    """`<bos>` and random bytes twice (clean), the first copy re-drawn (corrupted), and the
    loss on the second copy (the induction report's discovery section, at this shape)."""
    period, n_bytes = (pos - 1) // 2, min(256, model.cfg.d_vocab)
    generator = torch.Generator().manual_seed(3)
    segment = torch.randint(0, n_bytes, (batch, period), generator=generator)
    bos = torch.full((batch, 1), min(256, model.cfg.d_vocab - 1))  # the byte models' <bos>
    clean = torch.cat([bos, segment, segment], dim=1)
    corrupted = clean.clone()
    corrupted[:, 1 : period + 1] = torch.randint(0, n_bytes, (batch, period), generator=generator)
    positions = torch.arange(period + 1, 2 * period)
    targets = clean[:, positions + 1]

    def second_copy_loss(logits: Tensor) -> Tensor:
        logprobs = logits[:, positions].log_softmax(-1)
        return -logprobs.gather(-1, targets[..., None])[..., 0].mean(-1)

    device = model.cfg.device
    return dict(
        clean_tokens=clean.to(device),
        corrupted_tokens=corrupted.to(device),
        metric=second_copy_loss,
    )


def discovery_attribution(model: HookedTransformer, prompts: dict) -> Group:
    """EAP, EAP-IG and ACDC over every edge, as multiples of one plain forward."""
    from analysis.discovery import acdc, edge_attribution

    bare, metric = BareTransformer(model), prompts["metric"]
    entries = [
        Entry(
            "one forward of the clean prompts (bare reference)",
            BARE,
            lambda: metric(bare(prompts["clean_tokens"])),
        ),
        Entry(
            "EAP, every edge",
            OURS,
            lambda: edge_attribution(model, **prompts),
            lambda out: out.clean,
        ),
        Entry(
            f"EAP-IG, every edge, {IG_STEPS} steps",
            OURS,
            lambda: edge_attribution(model, **prompts, method="eap-ig", ig_steps=IG_STEPS),
            lambda out: out.clean,
        ),
        Entry(
            f"ACDC, threshold {ACDC_THRESHOLD}",
            OURS,
            lambda: acdc(model, **prompts, threshold=ACDC_THRESHOLD),
            lambda out: out.scores.clean,
        ),
    ]
    return Group(entries, rtol=1e-3)


def discovery_exact(model: HookedTransformer, prompts: dict) -> Group:
    """Exact edge patching of every edge, batched, against one forward per edge."""
    from analysis.discovery import edge_patching

    measure = "exact edge patching, every edge"
    entries = [
        Entry(
            f"{measure} (loop: one forward per edge)",
            OURS,
            lambda: _edge_patching_loop(model, prompts),
        ),
        Entry(measure, OURS, lambda: edge_patching(model, **prompts), lambda out: out.scores),
    ]
    return Group(entries, rtol=1e-3)


def _edge_patching_loop(model: HookedTransformer, prompts: dict) -> Tensor:
    """The definition, one forward per edge: the receiver's input (its own hook point, on
    a copy with split inputs) plus the sender's corrupted-minus-clean term. `[edge]`."""
    from analysis.discovery import Graph
    from analysis.discovery._terms import sender_terms, split_model, term_hooks

    graph, split, metric = Graph.from_model(model), split_model(model), prompts["metric"]
    clean = prompts["clean_tokens"]
    with torch.no_grad():
        terms = [
            sender_terms(split, split.run_with_cache(t, names_filter=term_hooks(split))[1], graph)
            for t in (clean, prompts["corrupted_tokens"])
        ]
        delta = terms[1] - terms[0]
        base = metric(split(clean))
        out = torch.empty(len(graph))
        for i, edge in enumerate(graph.edges):
            receiver = graph.receivers[edge.receiver]

            def patch(x: Tensor, hook: Any, r: Any = receiver, s: int = edge.sender) -> Tensor:
                if r.head is None:
                    return x + delta[s]
                x[:, :, r.head] += delta[s]
                return x

            logits = split.run_with_hooks(clean, fwd_hooks=[(receiver.hook, patch)])
            out[i] = (metric(logits) - base).mean()
    return out


# ------------------------------------------------------------------ sections


def _missing(need: str) -> str | None:
    """None if `need` (`module.attr`) exists, else why not: the measure waits for it."""
    module, attr = need.rsplit(".", 1)
    try:
        mod = __import__(module, fromlist=[attr])
    except ImportError as error:
        return f"{module} cannot be imported ({error})"
    return None if hasattr(mod, attr) else f"{need} does not exist yet"


def _time(run: Any, key: str, label: str, need: str, make: Callable[[], Group | None]) -> None:
    """Check and time one group once the code it measures exists."""
    why = _missing(need)
    if why is not None:
        run.skip("analysis", label, f"waits for {why}")
        return
    group = make()
    if group is None:
        run.skip("analysis", label, "needs transformer_lens (its row is the reference)")
        return
    group.check()
    entries = {(e.measure, e.contender): e.fn for e in group.entries}
    # Analyses take seconds per call on setting b: fewer rounds than the forward.
    run.time_group("analysis", key, entries, rounds=min(run.rounds, max(3, run.rounds // 3)))


# Setting -> the groups timed on it: (label, the function the group measures, its builder
# from the model, TransformerLens's copy of it and the setting's tokens).
_GROUPS: dict[str, tuple[tuple[str, str, Callable[..., Group]], ...]] = {
    "b": (
        ("composition scores", "analysis.composition.composition_scores",
         lambda model, tl, tokens: composition(model, tl)),
        ("factored SVD", "analysis.circuits.full_ov_circuit",
         lambda model, tl, tokens: factored_svd(model, tl)),
        *_TL_GROUPS,
    ),
    "a": (
        ("residual decomposition", "analysis.decomposition.decompose_resid", decomposition),
        ("head results", "analysis.head_results.head_results", head_results),
        *_TL_GROUPS,
    ),
}  # fmt: skip


def analysis_section(run: Any, shipped: tuple | None) -> None:
    """Circuits on setting b (GPT-2 small's shape), cache analyses on a, patching on c."""
    for key, groups in _GROUPS.items():
        setting = run.settings[key]
        print(f"analysis [{key}] {setting.description}")
        model, tokens = build(setting.cfg, setting.batch, setting.pos)
        with torch.no_grad():
            tl = run.tl_model(model, BareTransformer(model)(tokens), tokens)
            for label, need, make in groups:
                _time(run, key, label, need, functools.partial(make, model, tl, tokens))
    print("analysis [c] activation patching of every head x position")
    if shipped is not None:
        model = shipped[0]
    elif run.quick:  # exercise the code on random weights; a full run waits for the model
        model, _ = build(_cfg_attn_only_tiny(), 1, 1)
    else:
        run.skip("analysis", "activation patching", "waits for the shipped 2-layer model")
        return
    generator = torch.Generator().manual_seed(2)
    batch, pos = (2, 6) if run.quick else (4, 16)
    clean = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=generator)
    corrupted = torch.randint(0, model.cfg.d_vocab, (batch, pos), generator=generator)
    with torch.no_grad():
        tl = run.tl_model(model, BareTransformer(model)(clean), clean)
        _time(run, "c", "activation patching", "analysis.patching.activation_patch",
              lambda: patching(model, tl, clean, corrupted))  # fmt: skip
    _discovery_section(run, model)


def _discovery_section(run: Any, model: HookedTransformer) -> None:
    """Setting d: every edge of the shipped model scored, pruned and patched (no
    TransformerLens column: transformer_lens 3.0 has no edge attribution or edge patching)."""
    batch, pos = (2, 9) if run.quick else (8, min(127, model.cfg.n_ctx))
    name = model.cfg.model_name
    run.settings["d"] = Setting(
        "d",
        dataclasses.asdict(model.cfg),
        batch,
        pos,
        f"shipped {name}, circuit discovery: repeated random bytes "
        f"against the first copy re-drawn, loss on the second copy",
    )
    print(f"analysis [d] {run.settings['d'].description}")
    prompts = discovery_prompts(model, batch, pos)
    _time(
        run,
        "d",
        "edge attribution",
        "analysis.discovery.edge_attribution",
        lambda: discovery_attribution(model, prompts),
    )
    _time(
        run,
        "d",
        "exact edge patching",
        "analysis.discovery.edge_patching",
        lambda: discovery_exact(model, prompts),
    )


def _cfg_attn_only_tiny() -> dict:
    return dict(
        n_layers=2, d_model=16, n_heads=2, d_vocab=20, n_ctx=8, attn_only=True,
        normalization_type="LN", seed=0,
    )  # fmt: skip
