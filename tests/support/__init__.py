"""Builders the tests share (manifests, pod statuses, a fake API, child processes), one copy
each. Importable as ``tests.support`` from the repository root, which pytest puts on
``sys.path`` (``pythonpath`` in pyproject.toml) and bench scripts insert themselves. Only the
pytest plugin ``interrupts`` and the kind cluster fixture ``kind`` import pytest; no module here
imports a test file, and bench/ uses the others."""
