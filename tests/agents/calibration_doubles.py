"""Shared data of the calibration tests: a task start, demonstrations, candidate sets, recorded
trials, scripted review replies and label lines (as ``cb-agent calibrate label`` writes them)."""

from agent_shell.experience import NO_UPDATE
from cb_io.records import Step, TaskStart, Trajectory
from cb_io.storage import append_jsonl

START = TaskStart("a/1", "fetch", "Your task is to: solve a/1.", "You are in a small room.")
DEMOS = {"fetch": ["DEMO-FETCH"], "open": ["DEMO-OPEN"]}
CANDS = ["look", "inventory", "help", "go to window 1", "go to desk 1", "examine wall 1"]


def env_step(action, obs, cands=CANDS, done=False):
    return Step("env", action, obs, list(cands), done, False, 0.0)


def recorded(tmp_path, steps, task_id="a/3", split="train", name="r.jsonl"):
    traj = Trajectory("scripted", task_id, "fetch", f"Your task is to: solve {task_id}.", "You are in a small room.",
                      list(steps), False, 0.0, meta={"split": split})
    path = tmp_path / name
    append_jsonl(path, {"schema": "cb-agent/episode-v1", "agent": "react", "task_id": task_id, "task_type": "fetch",
                        "success": False, "trials": [{"won": False, "trajectory": traj.to_record(), "log": {}}]})
    return path


PLAYED = [env_step("go to window 1", "Nothing happens."), env_step("examine wall 1", "A plain wall."),
          Step("think", "think: hmm", "OK.", None, False, False, 0.0), env_step("go to window 1", "Nothing happens."),
          env_step("go to window 1", "Nothing happens.", done=True)]


def review_replies(prompt, temperature, n):
    if "Experience:" in prompt and "Latest action" in prompt:
        return ["The window cannot be used.", "The window cannot be used.", NO_UPDATE, "go to desk 1"][:n]
    return [" go to desk 1" if "The window cannot be used" in prompt else " go to window 1"] * n


def label_line(task_id, i, options, label, content_label=None):
    r = {"schema": "cb-agent/calibration-label-v1", "item": f"react:{task_id}#0@{i}", "split": "train",
         "task_id": task_id, "task_type": "fetch", "instruction": f"Your task is to: solve {task_id}.",
         "observation": "You are in a small room.", "i": i,
         "history": [{"kind": "env", "action": f"go to shelf {j}", "observation": "Nothing happens."}
                     for j in range(i + 1)],
         "options": options + [NO_UPDATE], "label": label, "candidates": [], "judge": "expert-distance"}
    if content_label is not None:
        r["content_label"] = content_label
    return r
