"""The Hera authoring of fabrique's Workflow kinds: the ``fabrique-build``
WorkflowTemplate and its steps, the reconcile and mirror-sync CronWorkflows.

Each module holds a top-level object that ``hera generate yaml pipelines/`` finds. The
code the steps run lives in ``fabrique``; nothing in ``fabrique`` but ``render`` imports
this package.
"""

from __future__ import annotations

import sys

from fabrique.site.config import Site, load_site
from fabrique.site.errors import FabriqueError


def site_from_env() -> Site:
    """The site the module-level objects are authored from (``FABRIQUE_VALUES`` over the
    default site), for ``hera generate yaml``. A bad one stops with fabrique's one-line
    error and exit code, not a traceback out of hera's module loader."""
    try:
        return load_site()
    except FabriqueError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
