"""``python -m strategyjob`` is the ``strategyjob`` command line."""

from strategyjob.cli import main

raise SystemExit(main())
