"""Builders the tests share (manifests, pod statuses, a fake API, child processes), one copy
each. Importable as ``tests.support`` from the repository root, which pytest puts on
``sys.path`` (``pythonpath`` in pyproject.toml) and bench scripts insert themselves; no module
here imports pytest or a test file, so that bench/ can use them too."""
