"""The decision explorer (``cb-agent view``): one self-contained HTML page that shows why an agent
chose each action: every scored decision's candidates ranked, with their prior and concept terms.

* :mod:`agent_shell.view.data`: what the page holds, read from results and eval-decisions files;
* :mod:`agent_shell.view.page`: the page itself (``explorer.js`` and ``explorer.css`` inlined).

Imports no LM, no JAX and no game engine.
"""

from agent_shell.view.data import Inputs, read_inputs
from agent_shell.view.page import embedded, render_page

__all__ = ["Inputs", "embedded", "read_inputs", "render_page"]
