"""fabrique: an in-cluster image factory that deploys by frozen digest.

The public surface: the site config, the error tree, and the names every caller shares.
"""

from fabrique.site.config import Site, load_site
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
