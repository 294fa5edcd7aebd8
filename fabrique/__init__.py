"""fabrique: an in-cluster image factory that deploys by frozen digest.

The public surface: the site config, the error tree, and the names every caller shares.

The site config is imported when first asked for: it is a pydantic model, and
``fabrique validate`` (which reads no site) is quicker to start without it.
"""

from typing import TYPE_CHECKING, Any

from fabrique.site.errors import (
    ConfigError,
    DigestMismatch,
    FabriqueError,
    GiteaError,
    GitError,
    ImageNotFound,
    InputError,
    KubeError,
    RegistryError,
    RemoteError,
    RenderError,
    TargetError,
    ValidationFailed,
)
from fabrique.site.names import workflow_name

if TYPE_CHECKING:
    from fabrique.site.config import Site, load_site

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "DigestMismatch",
    "FabriqueError",
    "GitError",
    "GiteaError",
    "ImageNotFound",
    "InputError",
    "KubeError",
    "RegistryError",
    "RemoteError",
    "RenderError",
    "Site",
    "TargetError",
    "ValidationFailed",
    "__version__",
    "load_site",
    "workflow_name",
]


def __getattr__(name: str) -> Any:
    if name in ("Site", "load_site"):
        from fabrique.site import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
