"""ScienceWorld through the protocol: gold paths, candidates, ambiguity answers, JVM restarts."""

from __future__ import annotations

import pytest

from agent_shell.expert_decisions import decision_examples
from envs import Episode, make_env
from envs.collect import play_expert
from envs.scienceworld import candidate_spelling

TASK = "lifespan-longest-lived/0"  # a short gold path (about 6 actions), two of them appended


@pytest.fixture(scope="module")
def env():
    e = make_env("scienceworld")
    yield e
    e.close()


def test_gold_path_reaches_score_100(env):
    traj = play_expert(env, TASK)
    assert traj.won and traj.score == 100
    assert traj.task_type == "lifespan-longest-lived" and "longest life span" in traj.instruction
    env_steps = [s for s in traj.steps if s.kind == "env"]
    assert all(s.action in s.candidates for s in env_steps)
    assert all(len(s.candidates) > 50 for s in env_steps)  # valid action-object combinations
    # the valid-combination list lacks some gold actions (here the door openings, doors being open
    # already under "easy"): the collector appends each to its saved set, once, last, and flags it
    appended = [s for s in env_steps if s.info.get("expert_appended")]
    assert appended, "this task's gold path was chosen for its appended expert steps"
    assert any(s.action.startswith("open door to") for s in appended)
    for s in appended:
        assert s.candidates[-1] == s.action and s.action not in s.candidates[:-1]
    for s in env_steps:
        if not s.info.get("expert_appended"):
            assert s.action in s.candidates
    examples, skipped = decision_examples(traj)
    assert len(examples) == len(env_steps) and skipped == 0
    kept, skipped_appended = decision_examples(traj, skip_expert_appended=True)
    assert skipped_appended == len(appended)
    assert [e.expert_action for e in kept] == [s.action for s in env_steps if not s.info.get("expert_appended")]


def test_jvm_restart_keeps_the_episode(env):
    ep = Episode(env, TASK, expert=True)
    ep.act(ep.expert_action())
    ep.act("think: the animals are outside")
    env._sw._gateway.java_process.kill()  # a crashed simulator
    restarts = env.jvm_restarts
    result = ep.act(ep.expert_action())
    assert env.jvm_restarts == restarts + 1 and result.info["jvm_restarts"] == 1
    assert [s.kind for s in ep.steps] == ["env", "think", "env"]
    while not ep.done and ep.expert_action() is not None:
        ep.act(ep.expert_action())
    assert ep.won


def test_candidate_spelling():
    cands = {"focus on thermometer", "open kitchen door", "use thermometer on substance in metal pot"}
    assert candidate_spelling("focus on thermometer in inventory", cands) == "focus on thermometer"
    assert candidate_spelling("open door to kitchen", cands) == "open kitchen door"
    assert candidate_spelling("use thermometer in inventory on substance in metal pot", cands) == \
        "use thermometer on substance in metal pot"
    assert candidate_spelling("examine steam", cands) == "examine steam"


def test_bad_task_ids(env):
    with pytest.raises(ValueError):
        env.reset("boil")
    with pytest.raises(ValueError, match="unknown ScienceWorld task"):
        env.reset("no-such-task/0")
    with pytest.raises(ValueError, match="unknown ScienceWorld split"):
        env.tasks("valid")


@pytest.mark.slow
def test_ambiguity_prompt_is_answered_and_recorded(env):
    traj = play_expert(env, "grow-fruit/0")
    answered = [s.info["ambiguity"] for s in traj.steps if "ambiguity" in s.info]
    assert answered and all(a["prompt"].startswith("Ambiguous request") and a["answer"].isdigit() for a in answered)
    assert traj.won


# -- ids checked without the JVM, the gold path only for the expert, one-line errors -------

def test_a_bad_variation_is_one_line_before_the_simulator_starts():
    fresh = make_env("scienceworld")
    try:
        with pytest.raises(ValueError) as err:
            fresh.reset("boil/9999")  # the simulator would fail in its gold path with a Java stack trace
        assert str(err.value) == ("ScienceWorld task 'boil/9999': boil has variations 0-29 "
                                  "(train 0-13, dev 14-20, test 21-29)")
        assert fresh.split_of("boil/25") == "test" and fresh.split_of("use-thermometer/269") == "train"
        with pytest.raises(ValueError, match="belongs to split 'test', not 'train'"):
            Episode(fresh, "boil/25", split="train")  # a test variation collected as train
        with pytest.raises(ValueError, match="closest: 'boil'"):
            fresh.split_of("boill/1")
        assert fresh._sw is None  # no JVM was started
    finally:
        fresh.close()


@pytest.mark.parametrize("names", [("boil", "identify-life-stages-2", "lifespan-longest-lived"),
                                   pytest.param(None, marks=pytest.mark.slow)])
def test_the_variation_table_is_the_simulators(env, names):
    from envs.scienceworld import VARIATION_SPLITS

    table = VARIATION_SPLITS["1.2.3"]
    names = names or env._call(lambda sw: list(sw.get_task_names()), 60)
    assert set(names) <= set(table) and len(table) == 30
    for name in names:
        def variations(sw, name=name):
            sw.load(name, 0, "")
            return [sorted(vs) for vs in (sw.get_variations_train(), sw.get_variations_dev(), sw.get_variations_test())]

        train, dev, test = env._call(variations, env.load_timeout_s)
        n_train, n_dev, n_test = table[name]
        assert (train, dev, test) == (list(range(n_train)), list(range(n_train, n_train + n_dev)),
                                      list(range(n_train + n_dev, n_train + n_dev + n_test)))


def test_agent_episodes_load_no_gold_path_and_chained_inputs_are_invalid(env):
    ep = Episode(env, TASK)
    assert env.gold_path is False and env.expert_action() is None
    fresh = ep.candidates()
    result = ep.act("look around then inventory")
    assert result.observation == "No known action matches that input."
    assert ep.candidates() == fresh
    assert ep.trajectory().meta["split"] == "train"


def test_java_errors_become_one_line():
    from cb_io.records import EngineError, one_line

    class Py4JJavaError(Exception):
        pass

    java = Py4JJavaError("An error occurred while calling o2.load.\n: java.lang.IndexOutOfBoundsException: 9999\n"
                         "\tat scala.collection.mutable.ResizableArray.apply(ResizableArray.scala:46)\n"
                         "\tat py4j.GatewayConnection.run(GatewayConnection.java:240)\n")
    assert one_line(java) == ("Py4JJavaError: An error occurred while calling o2.load. "
                              "java.lang.IndexOutOfBoundsException: 9999")
    assert one_line(EngineError("already one line")) == "already one line"
