"""``python -m fabrique``: the same CLI as the ``fabrique`` console script."""

from fabrique.cli import main

main()
