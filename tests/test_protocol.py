"""The worker <-> parent messages: each survives its line, a line that is not one fails clearly."""

import json
from pathlib import Path

import pytest
from helpers import LOOP, needs_two_cpus

from corescale.errors import UserError
from corescale.explain.run import answer
from corescale.measure import protocol
from corescale.measure.instance import InstanceHandle
from corescale.measure.launcher import InstanceFailed, Launcher
from corescale.measure.runner import prepare_trial
from corescale.overrides import compose

MESSAGES = [
    protocol.Loaded(1.25), protocol.Warming(3), protocol.Ready(12, False, 4_000, None), protocol.Ready(8, True, 10, 7),
    protocol.Progress(40), protocol.Served(1, 10, 20, 32, 17), protocol.Result({"instance": 1, "cpu_seconds": 0.5}),
    protocol.Profiled({"latencies_us": [1.0]}), protocol.WorkerFailure("user", "bad input", None),
    protocol.Unanswered(4, "IndexError: index 30522 is out of bounds"),
    protocol.Ready(8, True, 10, 7, [[1, 1_200_000], [8, 3_400_000]]),
    protocol.Checked({"task": "embed", "metrics": {"cosine_p1": 0.93}, "rows": 32}),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_survives_its_line(message):
    line = protocol.encode(message)
    assert line.endswith("\n") and line.count("\n") == 1
    assert protocol.decode(line) == message
    assert protocol.decode(line.encode()) == message  # as the launcher reads it


def test_reports_travel_flat_beside_the_event_name():
    assert protocol.fields(protocol.Result({"instance": 2})) == {"event": "result", "instance": 2}


@pytest.mark.parametrize(("line", "says"), [
    ("Traceback (most recent call last):", "not a JSON message"),
    ('["loaded"]', "without an event name"),
    ('{"event": "finished"}', "unknown event 'finished'"),
    ('{"event": "ready", "warmup_iterations": 3, "call_ns": 5}', "'ready' without its field converged"),
    ('{"event": "progress", "done": "7"}', "done='7' is not of type int"),
    ('{"event": "progress", "done": true}', "done=True is not of type int"),
    ('{"event": "loaded", "load_seconds": 1, "pid": 4}', "unknown fields pid"),
    ('{"event": "error", "kind": "oops", "message": "m"}', "unknown kind 'oops'"),
])
def test_a_line_that_is_no_message_is_a_protocol_error(line, says):
    with pytest.raises(protocol.ProtocolError, match=says.replace("(", r"\(").replace("[", r"\[")):
        protocol.decode(line)


def test_failure_kind_follows_the_exception():
    for exc, kind in ((UserError("bad"), "user"), (RuntimeError(), "error")):
        try:
            raise exc
        except BaseException as caught:  # what the workers do
            failure = protocol.WorkerFailure.of(caught)
        assert failure.kind == kind and "Traceback" in failure.traceback
    assert failure.message == "RuntimeError"  # no text: the exception's name


def test_the_launcher_fails_an_instance_that_sends_a_malformed_line(tmp_path):
    inst = InstanceHandle(3, None, Path(tmp_path / "none.log"), state="warming")
    with pytest.raises(InstanceFailed) as failed:
        Launcher._decode(inst, b'{"event": "ready"}')
    failure = failed.value.failure
    assert failure.kind == "error" and failure.instance == 3
    assert failure.reason.startswith("instance 3: sent a malformed message while warming: 'ready' without")


def test_the_explain_worker_answer_is_its_profile_or_its_failure():
    assert answer({"event": "profile", "calls": []}).profile == {"calls": []}
    with pytest.raises(UserError, match="^bad input$"):
        answer(protocol.fields(protocol.WorkerFailure("user", "bad input")))
    with pytest.raises(RuntimeError, match="explain worker failed: boom"):
        answer(protocol.fields(protocol.WorkerFailure("error", "boom", "Traceback ...")))
    with pytest.raises(RuntimeError, match="malformed answer: a message without an event name"):
        answer({"kind": "profile"})  # 0.2's answer, without an event name
    with pytest.raises(RuntimeError, match="answered 'progress'"):
        answer({"event": "progress", "done": 1})


@needs_two_cpus
def test_a_job_survives_its_file_and_names_every_sibling_cpu(tmp_path, toy):
    trial = prepare_trial(compose([*LOOP, "instances=2", "cores_per_instance=1"]))
    specs = trial.instance_specs(tmp_path)
    files = protocol.TrialFiles(queries="/q.npz", tokenizer="/tok")
    jobs = protocol.Job.each(trial.cfg, trial.model, specs, files)
    read = protocol.Job.read(jobs[0].write(tmp_path / "job.json"))
    assert (read.config, read.instance, read.files) == (trial.cfg, specs[0], files) and read.files.quality is None
    assert json.loads(json.dumps(jobs[0].to_json())) == read.to_json()
    assert read.trial_cpus == tuple(sorted(c for spec in specs for c in spec.cpus))


COMMANDS = [protocol.Warmup(), protocol.Start(1_234_567_890), protocol.Batch(7, (3, 0, 12)), protocol.Stop(),
            protocol.Infer(2, [[101, 7, 102], [101, 102]], [None, None]),
            protocol.Infer(3, [[101, 7, 102], [101, 102]], [[0, 0, 1], None]),  # a pair beside a single text
            protocol.Infer(4, [[]], [None]), protocol.Infer(5, [[101], [], [102]], [None, None, None])]  # empty rows


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: type(c).__name__)
def test_every_command_survives_its_line(command):
    line = protocol.say(command)
    assert line.endswith("\n") and line.count("\n") == 1
    assert protocol.heard(line) == command


def test_the_words_on_the_wire_are_the_documented_ones():
    assert [protocol.say(c) for c in COMMANDS[:4]] == ["warmup\n", "start 1234567890\n", "batch 7 3,0,12\n",
                                                       "stop\n"]
    assert protocol.say(COMMANDS[5]) == "infer 3 101,7,102/0,0,1;101,102\n"
    assert protocol.heard("") is None  # end of input


@pytest.mark.parametrize(("line", "says"), [
    ("abort\n", "not a command: 'abort"), ("start\n", "malformed 'start'"), ("batch 1 2,x\n", "malformed 'batch'"),
    ("warmup now\n", "not a command"), ("infer 1\n", "malformed 'infer'"),
])
def test_a_line_that_is_no_command_is_a_protocol_error(line, says):
    with pytest.raises(protocol.ProtocolError, match=says):
        protocol.heard(line)


def test_a_malformed_infer_line_still_names_its_batch_when_it_can():
    assert [protocol.infer_number(line) for line in ("infer 12 1,x\n", "infer\n", "infer x 1\n", "batch 3 1\n")] == \
        [12, -1, -1, -1]
