"""CB-Agent's 2-token routing peek with the real SmolLM2 tokenizer and model (float32).

:meth:`agent_shell.agents.CBAgent.route` generates :data:`ROUTE_PEEK_TOKENS` tokens and the whole
line only when those could still begin ``think:``. With the real tokenizer the peek must give
the same step kind as ReAct's whole-line reply on the same prompt, be exactly the first tokens of
that reply, and stop after two tokens on action steps.
"""

from __future__ import annotations

from agent_shell.agents import AgentConfig, CBAgent, ReActAgent, View
from agent_shell.agents.cb_agent import ROUTE_PEEK_TOKENS
from agent_shell.candidates import FormatError, parse_reply
from agent_shell.context import render_demo
from cb_io.records import Step, TaskStart


def env(action, observation):
    return Step("env", action, observation, [action], False, False, 0.0)


def thought(text):
    return Step("think", f"think: {text}", "OK.", None, False, False, 0.0)


# a demonstration that thinks after every action, so the model's next line is a thought after an
# action and an action after a thought
DEMO = render_demo("Your task is to: put a clean mug in coffeemachine.",
                   "You are in the middle of a room. You see a cabinet 1, a sinkbasin 1 and a coffeemachine 1.",
                   [thought("First I need to find a mug. It may be in the cabinet."),
                    env("go to cabinet 1", "On the cabinet 1, you see a mug 1."),
                    thought("Now I find a mug 1. Next, I need to take it."),
                    env("take mug 1 from cabinet 1", "You pick up the mug 1 from the cabinet 1."),
                    thought("Now I take a mug 1. Next, I need to clean it with sinkbasin 1."),
                    env("clean mug 1 with sinkbasin 1", "You clean the mug 1 using the sinkbasin 1."),
                    thought("Now I clean a mug 1. Next, I need to put it in coffeemachine 1."),
                    env("go to coffeemachine 1", "On the coffeemachine 1, you see nothing."),
                    env("move mug 1 to coffeemachine 1", "You move the mug 1 to the coffeemachine 1.")])
START = TaskStart("clean-mug/1", "clean", "Your task is to: put a clean cup in cabinet 1.",
                  "You are in the middle of a room. You see a cabinet 1, a countertop 1 and a sinkbasin 1.")
HISTORIES = [
    (),
    (thought("First I need to find a cup. It may be on the countertop."),),
    (thought("First I need to find a cup. It may be on the countertop."),
     env("go to countertop 1", "On the countertop 1, you see a cup 2.")),
    (thought("First I need to find a cup. It may be on the countertop."),
     env("go to countertop 1", "On the countertop 1, you see a cup 2."),
     thought("Now I find a cup 2. Next, I need to take it.")),
]


def kind(reply: str) -> str:
    try:
        return parse_reply(reply)[0]
    except FormatError:
        return "malformed"


def test_the_peek_gives_the_whole_line_step_kind_with_the_real_tokenizer(fresh):
    config = AgentConfig.for_env("alfworld")
    full = ReActAgent(fresh(), {"clean": [DEMO]}, config=config)
    peek = CBAgent(fresh(), {"clean": [DEMO]}, concepts=None, config=config)
    tokenizer = full.lm.tokenizer
    kinds = []
    for steps in HISTORIES:
        prompt = full.prompt(View(START, steps))
        assert prompt == peek.prompt(View(START, steps))
        whole, short = full.route(prompt), peek.route(prompt)
        kinds.append(kind(whole))
        assert (kind(whole) == "think") == (kind(short) == "think"), (whole, short)
        assert whole.startswith(short), (whole, short)
        if kind(whole) == "think":
            assert short == whole  # a thought is generated to the end of its line
        else:
            assert len(tokenizer(short, add_special_tokens=False)["input_ids"]) <= ROUTE_PEEK_TOKENS, short
    # the histories were built so that both branches of the peek run
    assert "think" in kinds and "action" in kinds, kinds
