"""One module per ``cb-agent`` sub-command (registered in :mod:`agent_shell.cli`)."""
