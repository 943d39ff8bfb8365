"""TransformerLens 3.x's `utilities.hf_utils`, where a hub is not used: `enable_hf_retry`.

hookedattn loads models from local folders and shipped checkpoints only, so there is no
hub call to retry.
"""


def enable_hf_retry() -> None:
    """TL wraps the hub loaders with retries; nothing here calls the hub, so nothing to do."""


__all__ = ["enable_hf_retry"]
