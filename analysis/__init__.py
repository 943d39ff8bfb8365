"""analysis: what a model's weights and cache mean.

Pure functions of `(model, cache)`: they never mutate their inputs, never attach hooks on
their own behalf (patching excepted, always scoped), and each returns one type.
"""

__all__: list[str] = []
