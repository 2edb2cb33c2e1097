"""Strategies: ``base`` (Strategy, StrategyExtended, the default strategy), ``one_device``,
``mirrored``, ``central_storage`` and ``multi_worker_mirrored``. Each is imported where used."""
