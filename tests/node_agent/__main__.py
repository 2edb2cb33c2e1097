"""``python -m node_agent --kubeconfig FILE`` (with ``tests/`` on ``PYTHONPATH``)."""

import sys

from node_agent.agent import main

sys.exit(main())
