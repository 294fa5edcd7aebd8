"""The event path's kinds: Gitea webhook -> EventSource -> EventBus (JetStream) -> Sensor.

One module per kind (``gitea``, ``eventbus``, ``sensor``), each a plain mapping held to
the upstream schema by ``fabrique validate``. Seeding webhook #2 and the EventBus doctor
are operator gestures: ``fabrique.gestures.webhook`` and ``fabrique.gestures.doctor``.
"""
