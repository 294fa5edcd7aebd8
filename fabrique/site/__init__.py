"""The site model, lowest layer: the typed config, names and identifiers, the error tree,
and the Kubernetes object helpers. It imports nothing else of fabrique."""
