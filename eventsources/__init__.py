"""The event path: Gitea webhook -> EventSource -> EventBus (JetStream) -> Sensor.

One module per kind (``gitea``, ``eventbus``, ``sensor``), built on the ``hera.events``
models where they are right, plus ``webhook`` (seeding webhook #2 in Gitea) and
``doctor`` (reading the EventBus's JetStream state).
"""
