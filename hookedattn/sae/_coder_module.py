"""What an SAE and a transcoder share as modules: their weights' dtype, read from `W_enc`,
and `to`, which keeps `cfg.dtype` true to the weights."""

import dataclasses

import torch

from hookedattn.core.hooked_root import HookedRootModule


class CoderModule(HookedRootModule):
    """A hooked module with `W_enc` and a frozen dataclass `cfg` that has a `dtype` field."""

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the weights."""
        return self.W_enc.dtype

    def to(self, *args, **kwargs) -> "CoderModule":
        """`nn.Module.to`, keeping `cfg.dtype` true to the weights."""
        super().to(*args, **kwargs)
        name = str(self.W_enc.dtype).removeprefix("torch.")
        if name != self.cfg.dtype:
            self.cfg = dataclasses.replace(self.cfg, dtype=name)
        return self
