"""Faults around the training loop: an unreadable newest checkpoint, a resume from an earlier
step, a torn output line, a full disk, and a trainer killed between taking fleet groups and
checkpointing the steps that trained them."""

import json
import subprocess
import threading

import pytest

from pyvision_jax.agent.trajectory import TrajectoryGroup
from pyvision_jax.rollout.intake import GroupSpool, QueueIntake, Receipt
from pyvision_jax.rollout.queue import DeliveredGroups, LocalTrajectoryQueue
from pyvision_jax.run_logs import metric_names as tags
from pyvision_jax.run_logs.metrics import MetricsWriteError
from pyvision_jax.train.checkpoint import CheckpointWriteError, TrainCheckpoints
from tests.rollout.minimal_groups import scored_group
from tests.train.scripted_runs import answers_by_rollout, run, small_config
from tests.train.tensorboard_events import read_scalars


def config_every_step(steps):
    config = small_config(steps)
    config.train.checkpoint_every = 1
    config.train.keep_checkpoints = 5
    return config


def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous_with_one_warning(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    run(config_every_step(2), tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    for path in (tmp_path / "checkpoints" / "2" / "state").rglob("*"):
        if path.is_file():
            path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # truncated files
    lines = []
    summary, _ = run(
        config_every_step(3), tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout, log=lines.append
    )
    warnings = [line for line in lines if "is unreadable" in line]
    assert len(warnings) == 1 and "checkpoint step 2" in warnings[0] and "\n" not in warnings[0]
    assert (summary.first_step, summary.last_step) == (1, 3)


def test_a_resumed_run_writes_every_step_once_and_drops_a_torn_line(
    tmp_path, tiny_config, tiny_params, tokenizer, tasks
):
    config = config_every_step(3)
    config.train.checkpoint_every = 2
    run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    # As if killed after step 3 was logged but before its checkpoint: only step 2 is on disk.
    TrainCheckpoints(tmp_path / "checkpoints", 2, 5).all_steps()
    subprocess.run(["rm", "-rf", str(tmp_path / "checkpoints" / "3")], check=True)
    with open(tmp_path / "trajectories.jsonl", "a") as sample:
        sample.write('{"step": 4, "group": {"tas')  # a line torn by the crash
    config = config_every_step(4)
    config.train.checkpoint_every = 2
    summary, _ = run(config, tmp_path, tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
    assert (summary.first_step, summary.last_step) == (2, 4)
    steps = [step for step, _ in read_scalars(str(tmp_path / "tb"))[tags.FILTER_GROUPS_KEPT]]
    assert steps == [1, 2, 3, 4]
    records = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == [1, 2, 3, 4]


def test_a_full_disk_stops_the_run_with_one_line_naming_the_cause(tmp_path, tiny_config, tiny_params, tokenizer, tasks):
    disk = tmp_path / "small_disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(disk)], check=True)
    try:
        # the first write to fail is the checkpoint's or TensorBoard's (its writer is asynchronous)
        with pytest.raises((CheckpointWriteError, MetricsWriteError)) as raised:
            run(config_every_step(3), disk / "run", tiny_config, tiny_params, tokenizer, tasks, answers_by_rollout)
        first_line = str(raised.value).splitlines()[0]
        assert "not written" in first_line and ("No space left" in first_line or "ENOSPC" in first_line.upper()), (
            first_line
        )
        assert TrainCheckpoints(disk / "run" / "checkpoints", 1, 5).all_steps() in ([], [1])
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


def test_a_trainer_killed_before_its_checkpoint_trains_the_spooled_groups_after_restart(tmp_path):
    """Groups are acknowledged to the queue when taken, spooled until their step is
    checkpointed: a kill in between loses none and trains none twice."""
    queue = LocalTrajectoryQueue(max_backlog=10, max_staleness=1)
    queue.set_trainer_version(2)
    groups = [scored_group(f"t{i}", 0, version=2) for i in range(3)] + [scored_group("t0", 0, version=2)]
    for group in groups:
        queue.put(group)
    stop = threading.Event()
    killed = QueueIntake(queue, 5, dedup=DeliveredGroups(None, "run"), spool=GroupSpool(tmp_path / "spool"))
    assert [g.key for g in killed.take(2, stop)] == ["t0#0", "t1#0"]
    assert queue.stats().backlog == 2  # acknowledged when taken: the backlog never waits on checkpoints
    # killed here: no receipt acknowledged, so the spool still holds both groups
    restarted = QueueIntake(queue, 2, dedup=DeliveredGroups(None, "run"), spool=GroupSpool(tmp_path / "spool"))
    assert restarted.load_spool(trainer_version=2) == 2
    taken = restarted.take(3, stop)
    assert [g.key for g in taken] == ["t0#0", "t1#0", "t2#0"]  # replayed first, then the queue
    restarted.acknowledge(restarted.receipt())
    assert GroupSpool(tmp_path / "spool").files() == []
    # the fourth entry repeats t0#0 (a restarted worker's): dropped by key and counted
    with pytest.raises(TimeoutError, match="rollout.wait_timeout_s"):
        restarted.take(1, stop)
    assert restarted.stats()["duplicates_dropped"] == 1 and queue.stats().backlog == 0


def test_a_trainer_killed_after_its_checkpoint_but_before_acknowledging_trains_nothing_twice(tmp_path):
    """The checkpoint stores the groups it covers (`outstanding`); a restart from it releases
    them before replaying the spool, so a kill between commit and acknowledgement replays none."""
    queue = LocalTrajectoryQueue(max_backlog=10, max_staleness=1)
    queue.set_trainer_version(2)
    for group in [scored_group(f"t{i}", 0, version=2) for i in range(3)] + [scored_group("t0", 0, version=2)]:
        queue.put(group)
    stop = threading.Event()
    killed = QueueIntake(queue, 5, dedup=DeliveredGroups(None, "run"), spool=GroupSpool(tmp_path / "spool"))
    killed.take(1, stop)
    killed.acknowledge(killed.receipt())  # step 1, checkpointed and acknowledged
    assert [g.key for g in killed.take(1, stop)] == ["t1#0"]  # step 2
    checkpointed = json.loads(json.dumps(killed.outstanding().to_json()))  # saved with step 2's cursors
    assert checkpointed["keys"] == ["t1#0"] and len(checkpointed["files"]) == 1
    # killed here: step 2's checkpoint is committed, its receipt never acknowledged
    assert len(GroupSpool(tmp_path / "spool").files()) == 1
    dedup = DeliveredGroups(None, "run")
    dedup.commit(["t0#0"])  # what step 1's acknowledgement made permanent
    restarted = QueueIntake(queue, 1, dedup=dedup, spool=GroupSpool(tmp_path / "spool"))
    restarted.acknowledge(Receipt.from_json(checkpointed))
    assert restarted.load_spool(trainer_version=2) == 0 and GroupSpool(tmp_path / "spool").files() == []
    assert [g.key for g in restarted.take(1, stop)] == ["t2#0"]
    with pytest.raises(TimeoutError, match="rollout.wait_timeout_s"):
        restarted.take(1, stop)  # the repeat of t0#0
    assert restarted.stats()["duplicates_dropped"] == 1
    assert restarted.outstanding().keys == ("t2#0",)


def test_spooled_groups_from_discarded_weights_are_dropped_and_counted(tmp_path):
    spool = GroupSpool(tmp_path / "spool")
    for version in (0, 5):
        spool.write(scored_group(f"v{version}", 0, version=version).to_bytes())
    intake = QueueIntake(LocalTrajectoryQueue(), 5, spool=GroupSpool(tmp_path / "spool"))
    assert intake.load_spool(trainer_version=4) == 1  # 5 > 4: weights the restart discarded
    assert intake.stats()["future_dropped"] == 1
    # version 0 is 4 behind, but it was admitted when it arrived: the lost step trains it again
    assert [g.key for g in intake.take(1, threading.Event())] == ["v0#0"]
    assert len(spool.files()) == 1


def test_a_torn_spool_write_is_cleaned_up(tmp_path):
    (tmp_path / "spool").mkdir()
    (tmp_path / "spool" / ".000000000000.group.partial").write_bytes(b"half")
    spool = GroupSpool(tmp_path / "spool")
    assert spool.files() == [] and not list((tmp_path / "spool").iterdir())
    assert (
        TrajectoryGroup.from_bytes((spool.directory / spool.write(scored_group("t", 0).to_bytes())).read_bytes()).key
        == "t#0"
    )
