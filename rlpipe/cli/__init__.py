"""The `rlpipe` command."""
