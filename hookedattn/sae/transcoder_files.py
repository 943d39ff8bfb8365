"""Per-layer transcoders as a set in circuit-tracer 0.5's layout
(`hookedattn.sae._circuit_tracer_io` describes every layout it reads; a single transcoder
saves in SAELens's with `tc.save(folder)`)."""

from collections.abc import Sequence
from pathlib import Path

from hookedattn.sae import _circuit_tracer_io
from hookedattn.sae.transcoder import Transcoder


def save_transcoder_set(
    transcoders: Sequence[Transcoder],
    path: str | Path,
    model_name: str = "",
    scan: str | None = None,
) -> Path:
    """Write per-layer ReLU or JumpReLU transcoders (skip or not) for layers `0..n-1` in
    circuit-tracer 0.5's layout, which its `load_transcoders_from_cache` reads: a
    `config.yaml` (`model_kind: transcoder_set`, `model_name`, the hooks in circuit-tracer's
    names, `scan` when given) and `layer_{L}.safetensors` per layer as its
    `SingleLayerTranscoder.to_safetensors` writes them (`W_enc [d_sae d_in]`, `W_dec [d_sae
    d_out]`, `activation_function.threshold`); returns the folder. circuit-tracer's
    transcoders map `d_model` to `d_model` with one `d_sae` and one pair of hooks for every
    layer: other sets are refused, as are TopK ones."""
    return _circuit_tracer_io.save_transcoder_set(list(transcoders), path, model_name, scan)


def load_transcoder_set(path: str | Path) -> list[Transcoder]:
    """The per-layer transcoders of a folder in circuit-tracer's layout (`config.yaml` and
    one `.safetensors` per layer), in layer order: circuit-tracer 0.5's (`model_kind:
    transcoder_set`, `W_dec [d_sae d_out]`) or its first schema's (`transcoders` listed with
    their layers, `W_dec [d_out d_sae]`), told apart by the `config.yaml`. Its hook names
    are mapped to ours (`mlp.hook_in` is `ln2.hook_out`, `mlp.hook_out` `hook_mlp_out`)."""
    return _circuit_tracer_io.load_transcoder_set(Transcoder, path)
