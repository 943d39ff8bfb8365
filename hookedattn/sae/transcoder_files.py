"""Per-layer transcoders as a set in circuit-tracer's layout (`hookedattn.sae._circuit_tracer_io`
describes every layout; a single transcoder saves in SAELens's with `tc.save(folder)`)."""

from collections.abc import Sequence
from pathlib import Path

from hookedattn.sae import _circuit_tracer_io
from hookedattn.sae.transcoder import Transcoder


def save_transcoder_set(
    transcoders: Sequence[Transcoder], path: str | Path, model_name: str = ""
) -> Path:
    """Write per-layer ReLU transcoders in circuit-tracer's layout: a `config.yaml` naming
    the model and the hooks, and `layer_{L}.safetensors` per layer; returns the folder."""
    return _circuit_tracer_io.save_transcoder_set(list(transcoders), path, model_name)


def load_transcoder_set(path: str | Path) -> list[Transcoder]:
    """The per-layer transcoders of a folder in circuit-tracer's layout (`config.yaml` and
    one `.safetensors` per layer), in layer order."""
    return _circuit_tracer_io.load_transcoder_set(Transcoder, path)
