"""The `gpufed` command line: every command, how replies are rendered, and `make demo`.

The top room: nothing imports it.
"""
