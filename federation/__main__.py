"""`python -m federation` is the `gpufed` command."""

from federation.cli import main

main()
