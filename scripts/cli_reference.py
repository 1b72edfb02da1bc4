"""The command line's shared options as a reference table, generated from the one option set
(:data:`agent_shell.commands._common.SHARED_OPTIONS`) and the commands that take each option.

Used as an mkdocs hook (``hooks:`` in ``mkdocs.yml``): in ``docs/cli.md`` the marker
``<!-- shared-options -->`` becomes the table, so the page always matches the code. Run as a
script, it prints the table (``python scripts/cli_reference.py``).
"""

from __future__ import annotations

MARKER = "<!-- shared-options -->"


def cell(text: str) -> str:
    """``text`` safe inside a markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def shared_options_markdown() -> str:
    """One row per shared option: its flags, type, default, help (the shared text; a command may
    word it for itself) and the commands that take it."""
    import click

    from agent_shell.cli import leaf_commands
    from agent_shell.commands._common import SHARED_OPTIONS, SharedClickOption

    users: dict[tuple[str, ...], list[str]] = {}
    for path, command in leaf_commands():
        for param in command.params:
            if isinstance(param, SharedClickOption):
                users.setdefault(tuple(param.opts + param.secondary_opts), []).append(f"`{path}`")
    rows = ["| option | setting | type | default | what it sets | commands |", "|---|---|---|---|---|---|"]
    for name, option in SHARED_OPTIONS.items():
        param = click.Option(list(option.decls), **{k: v for k, v in option.attrs.items() if k != "cls"})
        flags = " / ".join(f"`{f}`" for f in option.flags)
        default = "" if param.default is None or param.is_flag and param.default is False else f"`{param.default}`"
        commands = users.get(tuple(param.opts + param.secondary_opts), [])
        rows.append(f"| {flags} | `{name}` | {cell(param.type.name)} | {default} | {cell(param.help or '')} | "
                    f"{', '.join(commands) or '-'} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    """mkdocs hook: the marker of ``cli.md`` replaced by :func:`shared_options_markdown`."""
    if page.file.src_uri == "cli.md":
        if MARKER not in markdown:
            raise ValueError(f"docs/cli.md lost its {MARKER} marker (the shared options' table goes there)")
        return markdown.replace(MARKER, shared_options_markdown())
    return markdown


if __name__ == "__main__":
    print(shared_options_markdown())
