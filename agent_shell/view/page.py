"""The decision explorer's page: one self-contained HTML file (its script and style inline, nothing
fetched from the network) that opens from disk in any browser.

The data of :mod:`agent_shell.view.data` sits in ``<script type="application/json">`` blocks: the
summary and the episode list in one (parsed when the page opens), each episode in its own block
``ep-<i>`` and the held-out decisions in ``heldout`` (parsed only when opened), so a full table
(134 games x 3 agents x 50 steps) opens at once. The script (``explorer.js``) and style
(``explorer.css``) beside this module are inlined as they are.

Imports no LM, no JAX and no game engine.
"""

from __future__ import annotations

import html
from importlib import resources
from pathlib import Path
from typing import Sequence

import orjson

from agent_shell.view.data import Inputs, episode_detail, episode_index, heldout_entries, summary


def script_json(value) -> str:
    """``value`` as JSON safe inside a ``<script>`` element (``<``, ``>`` and ``&`` escaped, so no
    text closes the element)."""
    text = orjson.dumps(value).decode()
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _asset(name: str) -> str:
    return resources.files("agent_shell.view").joinpath(name).read_text(encoding="utf-8")


def render_page(inputs: Inputs, sources: Sequence[str]) -> str:
    """The whole page for ``inputs`` (``sources``: the files it was built from, shown in its header)."""
    index = {"sources": [str(s) for s in sources], "notes": inputs.notes, "summary": summary(inputs.records),
             "episodes": episode_index(inputs.records), "heldout": len(inputs.heldout),
             "accuracy": inputs.accuracy}
    blocks = [f'<script type="application/json" id="index">{script_json(index)}</script>']
    blocks += [f'<script type="application/json" id="ep-{i}">'
               f'{script_json(episode_detail(r, inputs.expert.get(r["task_id"])))}</script>'
               for i, r in enumerate(inputs.records)]
    if inputs.heldout:
        blocks.append(f'<script type="application/json" id="heldout">{script_json(heldout_entries(inputs.heldout))}'
                      "</script>")
    title = html.escape(f"cb-agent decisions: {', '.join(Path(s).name for s in sources)}")
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{title}</title><style>{_asset('explorer.css')}</style></head>\n"
            f"<body><div id=\"app\">loading...</div>\n{chr(10).join(blocks)}\n"
            f"<script>{_asset('explorer.js')}</script></body></html>\n")


def embedded(page: str) -> tuple[dict, dict[int, dict], list[dict] | None]:
    """The data a page embeds, read back: (the index, episode number -> detail, the held-out
    decisions or None). The inverse of :func:`render_page`'s blocks (tests, tools)."""
    import re

    blocks = {m.group(1): orjson.loads(m.group(2)) for m in
              re.finditer(r'<script type="application/json" id="([^"]+)">(.*?)</script>', page, re.S)}
    episodes = {int(k[3:]): v for k, v in blocks.items() if k.startswith("ep-")}
    return blocks["index"], episodes, blocks.get("heldout")


__all__ = ["embedded", "render_page", "script_json"]
