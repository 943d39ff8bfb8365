"""What several test files share: model builders, references and fixtures. Not test modules.

Imported as `helpers.<module>` from any test folder: `pyproject.toml` puts `tests/` on
`sys.path` (pytest's `pythonpath` setting), also when one test file is run alone and in
either import mode. Test files never import one another.
"""
