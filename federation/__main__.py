"""`python -m federation` is the `gpufed` command."""

from federation.cli.main import main

main()
