"""The worker <-> parent messages: each survives its line, a line that is not one fails clearly."""

from pathlib import Path

import pytest

from corescale.errors import UserError
from corescale.explain.run import answer
from corescale.measure import protocol
from corescale.measure.launcher import InstanceFailed, InstanceProcess, Launcher

MESSAGES = [
    protocol.Loaded(1.25), protocol.Warming(3), protocol.Ready(12, False, 4_000, None), protocol.Ready(8, True, 10, 7),
    protocol.Progress(40), protocol.Served(1, 10, 20, 32, 17), protocol.Result({"instance": 1, "cpu_seconds": 0.5}),
    protocol.Profiled({"latencies_us": [1.0]}), protocol.WorkerFailure("user", "bad input", None),
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
    inst = InstanceProcess(3, None, Path(tmp_path / "none.log"), {}, state="warming")
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
