"""``python -m tabletstore.cli``: the ``tabletstore`` command."""

from tabletstore.cli.main import main

main()
