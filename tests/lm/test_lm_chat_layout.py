"""The chat layout on the real offline SmolLM2 (float32): a message-list context goes through the
tokenizer's chat template with a generation prompt, and a candidate is the next assistant
message's content. The reference below is computed independently of the backend."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agent_shell.context import scoring_context
from cb_io.records import Step

STEPS = [Step("env", "go to cabinet 1", "The cabinet 1 is closed.", ["go to cabinet 1"], False, False, 0.0),
         Step("think", "think: I should open it.", "OK.", None, False, False, 0.0),
         Step("env", "open cabinet 1", "You open the cabinet 1. In it, you see a mug 2.", ["open cabinet 1"],
              False, False, 0.0)]
MESSAGES = scoring_context("Your task is to: put a mug in the coffeemachine.",
                           "You are in the middle of a room. You see a cabinet 1 and a coffeemachine 1.",
                           STEPS, "causal", layout="chat")
CANDIDATES = ["take mug 2 from cabinet 1", "close cabinet 1", "go to coffeemachine 1"]


@torch.inference_mode()
def naive_chat_score(lm, messages, action):
    """(log_q, n_tokens, hidden at the final token) by one full forward over
    apply_chat_template(...) + action."""
    tok = lm.tokenizer
    base = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok(base + action, add_special_tokens=False)["input_ids"]
    first = max(k for k in range(len(ids) + 1) if base.startswith(tok.decode(ids[:k])))
    out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    logp = torch.log_softmax(out.logits[0].double(), dim=-1)
    log_q = sum(logp[j - 1, ids[j]].item() for j in range(first, len(ids)))
    return log_q, len(ids) - first, out.hidden_states[-1][0, -1].double().numpy()


def test_chat_context_scoring_equals_the_naive_templated_sequence(lm32, fresh_any):
    assert [m["role"] for m in MESSAGES] == ["user"] + ["assistant", "user"] * 3
    got = fresh_any().score(MESSAGES, CANDIDATES, action_prefix="")
    for m, action in enumerate(CANDIDATES):
        log_q, n_tok, hidden = naive_chat_score(lm32, MESSAGES, action)
        assert got.n_tokens[m] == n_tok, action
        assert abs(float(got.log_q[m]) - log_q) < 1e-4, (action, got.log_q[m], log_q)
        # hidden (what concepts are fitted on): the LM-head input at the final action token
        rel = np.abs(got.hidden[m] - hidden).max() / np.abs(hidden).max()
        assert rel < 1e-4, (action, rel)
    # the rendered conditioning ends with the opened assistant turn
    assert lm32.render(MESSAGES, "").endswith("<|im_start|>assistant\n")


def test_chat_generation_continues_the_assistant_turn(lm32, fresh_any):
    lm = fresh_any()
    (reply,) = lm.generate(MESSAGES, max_new_tokens=6)
    text = lm32.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    assert lm.render_prompt(MESSAGES) == text and text.endswith("<|im_start|>assistant\n")
    ids = torch.tensor([lm32.tokenizer(text, add_special_tokens=False)["input_ids"]])
    out = lm32.model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=lm32.tokenizer.eos_token_id)
    assert reply == lm32.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert reply.strip() and "<|im_start|>" not in reply


@pytest.mark.parametrize("messages, culprit", [
    (MESSAGES[:1] + [{"role": "robot", "content": "beep"}], "message 1"),
    ([{"role": "user", "content": 7}], "message 0"),
    ([{"role": "user", "content": "hi"}, "not a dict"], "message 1"),
    ([], "empty message list"),
])
def test_malformed_message_lists_are_named(lm32, messages, culprit):
    with pytest.raises(ValueError, match=culprit):
        lm32.score(messages, ["look"], action_prefix="")
    with pytest.raises(ValueError, match=culprit):
        lm32.generate(messages, max_new_tokens=2)
