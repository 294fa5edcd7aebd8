"""The operator's gestures, each one replayable: seed, derived Secrets, Gitea mirrors,
webhook #2 and the hooks to Argo CD, the EventBus doctor, vendoring, and the lint of a
cluster/apps checkout."""
