"""The environments of an app as scenario 34 walks them, for the shell: one line each,
tab-separated,

    NAME TARGET CONTEXT ARGOCD_NAMESPACE APPLICATION NAMESPACE [CHECK…]

in promotion order, from the site fabrique loads (``FABRIQUE_VALUES``), with the same
defaults ``fabrique seed`` and ``fabrique promote`` take (a check holds no control
character: the config says so). An app without environments is one line, NAME, TARGET
and CONTEXT ``-``.

    python bench/scenarios/environments.py APP      # exit 2: no such app, a bad site
"""

from __future__ import annotations

import argparse
import sys

from fabrique.site.config import Site, load_site
from fabrique.site.errors import FabriqueError


def lines(site: Site, name: str) -> list[str]:
    app = site.app(name)
    if not app.environments:
        deployment = app.deployment()
        namespace = deployment.destination if deployment else "-"
        return ["\t".join(["-", "-", "-", "argocd", app.name, namespace])]
    found = []
    for env in app.environments:
        argocd, application = env.application_ref(app.name)
        deployment = app.deployment(env)
        namespace = deployment.destination if deployment else "-"
        context = site.targets[env.target].context
        found.append(
            "\t".join([env.name, env.target, context, argocd, application, namespace, *env.checks])
        )
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="environments.py",
        description="The environments of an app as scenario 34 walks them, one line each.",
    )
    parser.add_argument("app", metavar="APP")
    args = parser.parse_args(argv)
    try:
        print("\n".join(lines(load_site(), args.app)))
    except FabriqueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
