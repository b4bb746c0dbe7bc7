"""Entry point for ``python -m gaecli``."""

from gaecli.cli import main

main()
