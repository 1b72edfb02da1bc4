"""``python -m agent_shell``: the ``cb-agent`` command line, for when the script is not on the path."""

from agent_shell.cli import main

if __name__ == "__main__":
    main(prog_name="cb-agent")
