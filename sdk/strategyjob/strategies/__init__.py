"""Strategies: ``base`` (Strategy, StrategyExtended, the default strategy, and what the modules
around a strategy may ask of it), ``one_device``, ``mirrored``, ``central_storage``,
``multi_worker_mirrored``, ``parameter_server``, ``tpu`` and ``compat_methods`` (the compat.v1
methods). Each is imported where used."""
