"""The event path's kinds: Gitea webhook -> EventSource -> EventBus (JetStream) -> Sensor.

One module per kind (``gitea``, ``eventbus``, ``sensor``), built on the ``hera.events``
models where they are right. Seeding webhook #2 and the EventBus doctor are operator
gestures: ``fabrique.gestures.webhook`` and ``fabrique.gestures.doctor``.
"""
