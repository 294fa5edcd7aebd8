"""The clients of the outside world, one module per remote system: Gitea, the registry,
the Kubernetes API, git, and the HTTP plumbing they share (timeouts, bounded retries).
They import only the site model."""
