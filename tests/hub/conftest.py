"""The hub tests share the `hub` fixture: a local hub the real client is pointed at."""

from helpers.hub import hub  # noqa: F401  (a fixture)
