"""What can go wrong between a name and its files, each an `OSError` that says what to do.

Each wraps (`raise ... from`) the `huggingface_hub` error it translates, so the client's own
account stays in the traceback; the message adds the repo, the revision, the cache folder
and the fix.
"""


class HubError(OSError):
    """A name could not be turned into files (the subclasses say why)."""


class ModelNotFoundError(HubError, FileNotFoundError):
    """No shipped model, local folder, TransformerLens name or hub repo has this name."""


class RevisionNotFoundError(HubError, FileNotFoundError):
    """The repo exists, the revision (branch, tag, commit or checkpoint) does not."""


class GatedModelError(HubError, PermissionError):
    """The repo is gated or private and no (valid) token was sent."""


class NotCachedError(HubError, FileNotFoundError):
    """Offline (or unreachable), and the files are not in the cache."""


class DownloadInterruptedError(HubError, ConnectionError):
    """A download stopped part way; running the same load again resumes it."""


class NoWeightsError(HubError, FileNotFoundError):
    """The repo holds no weight file the import reads."""
