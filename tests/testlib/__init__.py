"""Test utilities shared by several test files (importable as `testlib.*` under pytest, whose
rootdir conftest puts tests/ on sys.path, and as `tests.testlib.*` from the repository root,
e.g. in a gin file that a CLI subprocess parses)."""
