"""The StrategyJob operator (kopf). Run it with ``python -m strategyjob_operator`` or
``kopf run -m strategyjob_operator``; importing the package registers its handlers.

Never imports torch: it shares only :mod:`strategyjob.jobspec` with the SDK.
"""

from strategyjob_operator import handlers as handlers

__all__ = ["handlers"]
