"""`agentgym eval` per task: each task's success over its episodes, a CI over tasks, pass@k, and the
paired difference with an earlier eval's JSON on the same tasks (`--paired-with`)."""

from __future__ import annotations

import json
import math

import pytest

from agentgym.app.cli import main
from agentgym.app.eval_run import load_eval_tasks
from agentgym.evaluation import paired_difference, per_task, task_summary
from agentgym.stats import bootstrap_ci, paired_bootstrap_ci
from agentgym.rollout_metrics import task_groups
from agentgym.trajectory import Trajectory


def episode(task: int, success: bool, infra: bool = False) -> Trajectory:
    summary = {"success": success, **({"infra_error": "retriever: 503"} if infra else {})}
    return Trajectory([1, 2, 3], [0, 0, 1], [0.0] * 3, 2, [(2, 3)], ["a"], ["stop"], [float(success)], [{}], [],
                      summary, True, False, group_id=task, task_index=task)


def test_per_task_means_pass_at_k_and_ci_over_tasks():
    # 3 tasks x 4 episodes: 3/4, 0/4, 1/4 solved
    trajs = [episode(7, s) for s in (1, 1, 0, 1)] + [episode(3, False)] * 4 + [episode(5, s) for s in (0, 0, 1, 0)]
    tasks = per_task(trajs, 4)
    assert [(t["task_index"], t["episodes"], t["scored"], t["success"]) for t in tasks] == \
        [(7, 4, 4, 0.75), (3, 4, 4, 0.0), (5, 4, 4, 0.25)]
    s = task_summary(tasks, 4)
    assert s["tasks"] == 3 and s["task_success"] == pytest.approx(1 / 3) and s["pass@4"] == pytest.approx(2 / 3)
    assert (s["task_success_ci_low"], s["task_success_ci_high"]) == bootstrap_ci([0.75, 0.0, 0.25])[1:]
    assert s["task_success_ci_low"] < 1 / 3 < s["task_success_ci_high"]
    assert "pass@1" not in task_summary(per_task(trajs, 1), 1)


def test_an_outage_is_neither_success_nor_failure_of_its_task():
    trajs = [episode(0, True), episode(0, False, infra=True), episode(1, False, infra=True), episode(1, True, infra=True)]
    tasks = per_task(trajs, 2)
    assert tasks[0]["success"] == 1.0 and tasks[0]["scored"] == 1          # the outage is not a failure
    assert math.isnan(tasks[1]["success"]) and tasks[1]["scored"] == 0      # nothing scored: no value
    assert task_summary(tasks, 2)["tasks"] == 1                               # and left out of the summary


def test_episodes_must_come_task_by_task():
    with pytest.raises(ValueError, match="groups of 3"):
        task_groups([episode(0, True)] * 4, 3)
    with pytest.raises(ValueError, match="task by task"):
        task_groups([episode(0, True), episode(1, True), episode(0, True), episode(1, True)], 2)


def test_paired_difference_matches_tasks_by_index_not_by_position():
    after = per_task([episode(i, s) for i, s in [(2, 1), (0, 1), (1, 0)]], 1)
    before = per_task([episode(i, s) for i, s in [(0, 0), (1, 0), (2, 1)]], 1)
    p = paired_difference(after, before)
    assert (p["tasks"], p["success"], p["baseline_success"]) == (3, pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert (p["difference"], p["ci_low"], p["ci_high"]) == paired_bootstrap_ci([1, 0, 1], [0, 0, 1])  # tasks 0, 1, 2
    assert (p["tasks_up"], p["tasks_down"]) == (1, 0)
    with pytest.raises(ValueError, match="different tasks"):
        paired_difference(after, per_task([episode(i, True) for i in (0, 1, 9)], 1))
    with pytest.raises(ValueError, match="distinct task indices"):
        paired_difference(after, per_task([episode(0, True), episode(0, True), episode(1, True)], 1))


def run_eval(*argv: str) -> int:
    return main(["eval", "Arithmetic-v0", "--episodes", "4", "--group-size", "2", *argv])


def test_cli_writes_per_task_records_and_pairs_two_policies(tmp_path, capsys):
    oracle, rand = tmp_path / "oracle.json", tmp_path / "random.json"
    assert run_eval("--policy", "oracle", "--json", str(oracle)) == 0
    out = capsys.readouterr().out
    assert "per task (4 tasks, mean of 2 episodes each): success 1.000" in out
    assert "pass@1 1.000, pass@2 1.000 (unbiased estimator)" in out
    assert run_eval("--policy", "tiny-random", "--max-new-tokens", "4", "--json", str(rand), "--paired-with", str(oracle)) == 0
    out = capsys.readouterr().out
    data = json.loads(rand.read_text())
    assert [t["episodes"] for t in data["per_task"]] == [2] * 4 and data["task_summary"]["pass@2"] == 0.0
    assert data["paired"]["with"] == str(oracle) and data["paired"]["difference"] == -1.0
    # every task fell by exactly 1: no spread, so no interval (NaN bounds and the reason, not [-1, -1])
    assert data["paired"]["tasks_down"] == 4 and math.isnan(data["paired"]["ci_low"])
    assert data["paired"]["ci_note"] == "tasks agree: no spread"
    assert "= -1.000, 95 % bootstrap CI n/a (tasks agree: no spread); 0 tasks up, 4 down; no interval" in out
    # a baseline whose tasks were solved 0, 1/2, 1 and 1/2 of the time: the oracle is higher, with an interval
    mixed = json.loads(oracle.read_text())
    for t, v in zip(mixed["per_task"], [0.0, 0.5, 1.0, 0.5]):
        t["success"] = v
    (tmp_path / "mixed.json").write_text(json.dumps(mixed))
    assert run_eval("--policy", "oracle", "--paired-with", str(tmp_path / "mixed.json")) == 0
    low, high = paired_bootstrap_ci([1.0] * 4, [0.0, 0.5, 1.0, 0.5])[1:]
    assert f"1.000 - 0.500 = +0.500, 95 % bootstrap CI [{low:+.3f}, {high:+.3f}]; 3 tasks up, 0 down; higher" in \
        capsys.readouterr().out and low > 0
    # the written file reads back the same per-task records, with or without its per_task key
    head, tasks = load_eval_tasks(str(rand))
    assert head["env"] == "agentgym/Arithmetic-v0" and head["group_size"] == 2 and tasks == data["per_task"]
    slim = {k: v for k, v in data.items() if k != "trajectories"}    # kept without its episodes: pairs the same
    (tmp_path / "slim.json").write_text(json.dumps(slim))
    assert load_eval_tasks(str(tmp_path / "slim.json")) == (head, tasks)
    assert run_eval("--policy", "oracle", "--paired-with", str(tmp_path / "slim.json")) == 0
    assert "= +1.000" in capsys.readouterr().out
    del data["per_task"]
    rand.write_text(json.dumps(data))
    assert load_eval_tasks(str(rand))[1] == [{**t, "success": 0.0} for t in tasks]
    del data["trajectories"]                                         # neither: not an eval file
    rand.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="neither per_task nor trajectories"):
        load_eval_tasks(str(rand))


def test_cli_refuses_a_baseline_that_cannot_be_paired(tmp_path, capsys):
    base = tmp_path / "base.json"
    assert run_eval("--policy", "oracle", "--json", str(base)) == 0
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "text.json").write_text("not json")
    for argv, says in [(["--paired-with", str(tmp_path / "missing.json")], "is not a file"),
                       (["--paired-with", str(tmp_path / "text.json")], "is not JSON"),
                       (["--paired-with", str(tmp_path / "list.json")], "is not an `agentgym eval --json` file"),
                       (["-e", "split=train", "--paired-with", str(base)], "not the same tasks")]:
        capsys.readouterr()
        assert run_eval("--policy", "oracle", *argv) == 2, argv      # refused before any episode ran
        assert says in capsys.readouterr().err
    assert main(["eval", "Math-v0", "--policy", "oracle", "--paired-with", str(base)]) == 2
    assert "evaluated agentgym/Arithmetic-v0, not agentgym/Math-v0" in capsys.readouterr().err
    # other tasks (another seed): the eval still runs and is written, the pairing is refused, exit 1
    other = tmp_path / "other.json"
    assert run_eval("--policy", "oracle", "--seed", "1", "--json", str(other), "--paired-with", str(base)) == 1
    assert "different tasks" in capsys.readouterr().err and "paired" not in json.loads(other.read_text())


def test_cli_evaluates_exactly_the_listed_tasks(tmp_path, capsys):
    out = tmp_path / "listed.json"
    assert run_eval("--policy", "oracle", "tasks=[42,3,17]", "--batch-size", "2", "--json", str(out)) == 0
    data = json.loads(out.read_text())
    assert [t["task_index"] for t in data["per_task"]] == [42, 3, 17]       # in the order given, across batches
    assert data["config"]["episodes"] == 3 and len(data["trajectories"]) == 6
    for bad, says in [("tasks=[]", "non-empty list"), ("tasks=[1,1]", "a task twice"), ("tasks=[-2]", ">= 0"),
                      ('tasks=["a"]', "tasks"), ("first_task=0", "not both")]:
        capsys.readouterr()
        assert run_eval("--policy", "oracle", "tasks=[1]" if bad.startswith("first") else bad,
                        *([bad] if bad.startswith("first") else [])) == 2, bad
        assert says in capsys.readouterr().err, bad
