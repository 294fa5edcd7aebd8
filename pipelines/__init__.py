"""The Hera authoring of fabrique's Workflow kinds: the ``fabrique-build``
WorkflowTemplate and its steps, the reconcile and mirror-sync CronWorkflows.

Each module holds a top-level object that ``hera generate yaml pipelines/`` finds. The
code the steps run lives in ``fabrique``; nothing in ``fabrique`` but ``render`` imports
this package.
"""
