"""The coverage page, `docs/guide/coverage.md`, written from `scripts/coverage.py`'s result
(the same object it writes to `scripts/data/coverage.json`)."""

from typing import Any


def page(result: dict[str, Any]) -> str:
    """The whole page: the counts, then one table per outcome."""
    records = result["architectures"]
    return "\n".join([
        "# Coverage of transformers' causal LMs",
        "",
        "<!-- Written by scripts/coverage.py (with scripts/data/coverage.json): do not edit. -->",
        "",
        "Every causal LM `transformers` registers (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), built",
        "tiny from its config class's defaults with random weights (2 layers, or the few a",
        "per-layer pattern needs; d_model 64, 4 heads, small vocabulary, every window, expert",
        "count and per-layer list shrunk with them), run forward, then imported with",
        "`HookedTransformer.from_hf(model)`: max |Δ| of the logits over their largest |value| in",
        "float32 and float64, and 4 greedily generated tokens against HF's `generate`. The",
        "float64 reference is HF's float64 model run in float64 throughout",
        "(`hookedattn.testing.float64_throughout`: stock HF rounds its RMSNorms, softmaxes and",
        "rotary angles to float32 in a float64 model; the |Δ| from stock HF is in the JSON file",
        "as `delta_float64_stock`). *Exact*: float32 |Δ| ≤ 1e-4, float64 |Δ| ≤ 1e-5 or, where",
        "larger, ≤ HF's own float64 logits' |Δ| from its float32 ones (a step that amplifies",
        "float32 rounding:",
        "Qwen3-Next's gated delta rule), the same tokens. Measured with transformers",
        f"{result['transformers']} and torch {result['torch']}: `{result['command']}`, "
        f"{result['wall_seconds']:.0f} s wall clock (one architecture at a time, each in its",
        f"own process; {result['cpus']} CPUs, load average {result['load_average']} at the end).",
        "",
        *_counts(result["counts"]),
        "",
        "## Imported",
        "",
        "*Per head*: the attention hook points whose cached value has a head axis, and in how",
        "many layers (a layer with a mixer in attention's place has none; its `mixer.hook_in`",
        "and `mixer.hook_out` are whole). *As a folder*: the model saved (`save_pretrained`)",
        "and loaded from its folder, `from_hf(path)`, which verifies on load: a tiny twin of",
        "the saved config run by transformers in float64 throughout and by ours in float64,",
        "every layer's stream and the logits within 1e-8 of their scale; the largest relative",
        "|Δ| and the seconds the verification took (one thread, nothing remembered).",
        "",
        *_imported([r for r in records if r.get("status") in ("exact", "wrong")]),
        "",
        "## Not imported, and the nearest family",
        "",
        "*Names*: the supported family whose tiny twin's tensor names (layer and expert",
        "indices aside) differ least from the architecture's, with how many of theirs it lacks",
        "and how many of its own it adds. *As a family*: the supported family that got",
        "furthest importing it as its own: to the logits (their |Δ|), to the tensors (the",
        "names apart), or no further than its config.",
        "",
        *_refused([r for r in records if r.get("status") in ("refused", "failed")]),
        "",
        "## Not built tiny",
        "",
        *_not_built([r for r in records if not r.get("builds_tiny")]),
        "",
    ])  # fmt: skip


def _counts(c: dict[str, int]) -> list[str]:
    rows = [
        ("registered causal LMs", c["registered"]),
        ("build tiny (random weights, finite logits)", c["builds_tiny"]),
        ("import exactly", c["exact"]),
        ("... of which float32 |Δ| ≤ 1e-5", c.get("exact_float32_1e5", "")),
        ("... of which float64 |Δ| ≤ 1e-10", c.get("exact_float64_1e10", "")),
        ("... of which verified on load from a folder", c.get("verified_on_load", "")),
        ("refused by `from_hf`, with its reason", c["refused"]),
        ("imported, but wrong", c["wrong"]),
        ("import raised an error of ours", c["failed"]),
    ]
    if c["stopped"]:
        rows.append(("stopped (a time-out or a crash)", c["stopped"]))
    return ["| | architectures |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]


def _imported(records: list[dict[str, Any]]) -> list[str]:
    rows = [
        "| class | model type | float32 | float64 | greedy | | as a folder | per head |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        folder = _folder(r)
        rows.append(
            f"| `{r['architecture']}` | {r['model_type']} | {_e(r['delta_float32'])} | "
            f"{_e(r['delta_float64'])} | {r['generation']} | {r['status']} | {folder} | "
            f"{r.get('per_head', '')} |"
        )
    return rows


def _folder(r: dict[str, Any]) -> str:
    verified = r.get("verified")
    if not r["folder"] or not verified:
        return "no: its model type is not a family's"
    if verified["status"] != "passed":
        return f"refused: {_cell(verified.get('message', ''), 80)}"
    return f"verified, {_e(verified['worst'])}, {verified['seconds']:.2f} s"


def _refused(records: list[dict[str, Any]]) -> list[str]:
    rows = ["| class | model type | names | as a family | refusal |", "|---|---|---|---|---|"]
    for r in records:
        message = r.get("message", "")
        unsupported = message.startswith("ValueError: cannot import") and "model_type=" in message
        rows.append(
            f"| `{r['architecture']}` | {r['model_type']} | {_by_names(r)} | {_by_import(r)} "
            f"| {'no family of its model type' if unsupported else _cell(message, 110)} |"
        )
    return rows


def _by_names(r: dict[str, Any]) -> str:
    near = r.get("nearest_by_names")
    if not near:
        return ""
    return f"{_short(near['family'])} −{near['missing']} +{near['unexpected']}"


def _by_import(r: dict[str, Any]) -> str:
    near = r.get("nearest_by_import")
    if not near:
        return ""
    family = _short(near["family"])
    if near["stage"] == "logits":
        return f"{family}: logits, Δ {_e(near['delta_float32'])}"
    if "missing" in near:
        return f"{family}: tensors, −{near['missing']} +{near['unexpected']}"
    return f"{family}: {near['stage']}, {_cell(near.get('message', ''), 60)}"


def _not_built(records: list[dict[str, Any]]) -> list[str]:
    rows = ["| class | model type | why |", "|---|---|---|"]
    for r in records:
        why = r.get("why_not") or r.get("error", "")
        rows.append(f"| `{r['architecture']}` | {r['model_type']} | {_cell(why, 120)} |")
    return rows


def _short(architecture: str) -> str:
    return architecture.removesuffix("ForCausalLM").removesuffix("LMHeadModel")


def _e(value: float | None) -> str:
    return "—" if value is None else f"{value:.1e}"


def _cell(text: str, limit: int) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"
