"""The chaos soak's verdict (bench/chaos/verdict.py) on synthetic fault logs: each reader error
is laid to the fault that caused it by time and endpoint, never excused by its wording, and
the run fails on an unexplained error, a replica fault that reached a reader, a second resume
for one host-agent fault, an idle reader, and (under CI) partitions that could not be made."""

from __future__ import annotations

import sys

import pytest

from conftest import REPO

sys.path.insert(0, str(REPO / "bench" / "chaos"))
sys.path.insert(0, str(REPO / "bench"))
import chaos  # noqa: E402
import verdict  # noqa: E402
from verdict import (HOST_FAULT, READER_FAULT, REPLICA_FAULT, UNEXPLAINED, Fault,  # noqa: E402
                     ReaderError)

T0 = 1000.0
UPSTREAM = {"host": ["replica0", "replica1", "replica2"]}


def err(at: float, started: float = 0.0, line: str = "error: connection closed",
        reader: str = "Reader 0", rc: int = 1) -> ReaderError:
    return ReaderError(reader, "host", T0 + started, T0 + at, rc, line)


def fault(kind: str, target: str, at: float, back=None) -> Fault:
    return Fault(kind, target, T0 + at, None if back is None else T0 + back)


def cause(e: ReaderError, faults) -> tuple:
    return verdict.classify(e, faults, UPSTREAM)


def test_an_error_after_its_host_agent_died_is_laid_to_that_fault():
    faults = [fault("replica_kill", "replica1", 1.0, 2.0), fault("host_kill", "host", 10.0, 10.5),
              fault("host_term", "host", 20.0, 21.0)]
    assert cause(err(10.02), faults) == (HOST_FAULT, 1)
    assert cause(err(21.5, started=15.0), faults) == (HOST_FAULT, 2)


def test_a_replica_fault_worded_like_a_host_failure_is_not_excused():
    # The old classifier called "connection closed" and "timed out" host-agent failures.
    faults = [fault("replica_kill", "replica0", 5.0, 6.0)]
    for line in ("error: connection closed", "error: timed out", "error: reset by peer"):
        assert cause(err(5.3, line=line), faults) == (REPLICA_FAULT, 0)
    faults = [fault("replica_partition", "replica2", 5.0, 8.0)]
    assert cause(err(7.0, line="error: timed out"), faults) == (REPLICA_FAULT, 0)


def test_a_run_begun_on_the_restarted_host_agent_is_not_excused_by_its_fault():
    # The host agent was back at 10.5 s; the reader began at 10.6 s, on the new process. Its
    # error 3 s later, while a replica was down, is the replica's.
    faults = [fault("host_kill", "host", 10.0, 10.5), fault("replica_kill", "replica1", 12.0, 13.0)]
    assert cause(err(13.5, started=10.6), faults) == (REPLICA_FAULT, 1)
    # Within the settle time it is the host fault's (a second resume for it, if the run before
    # failed for it too).
    assert cause(err(11.4, started=10.6), faults) == (HOST_FAULT, 0)


def test_a_message_naming_the_replicas_accuses_them_even_in_a_host_fault():
    faults = [fault("host_kill", "host", 10.0, 10.5)]
    assert cause(err(10.1, line="error: every replica of corpus/web failed"), faults) == \
        (REPLICA_FAULT, None)


def test_an_error_no_fault_explains_is_unexplained():
    assert cause(err(50.0), []) == (UNEXPLAINED, None)
    faults = [fault("host_kill", "host", 10.0, 10.5)]
    # Before the fault began:
    assert cause(err(9.5, started=2.0), faults) == (UNEXPLAINED, None)
    # Long after the host agent served again:
    assert cause(err(10.5 + verdict.LATE + 0.1), faults) == (UNEXPLAINED, None)
    # On a run begun after the settle time:
    assert cause(err(11.8, started=10.5 + verdict.SETTLE + 0.1), faults) == (UNEXPLAINED, None)


def test_a_host_agent_not_back_by_the_end_explains_what_follows():
    faults = [fault("host_term", "host", 100.0)]
    assert cause(err(130.0, started=90.0), faults) == (HOST_FAULT, 0)


def test_a_readers_own_kill_is_a_reader_fault_and_only_its_own():
    faults = [fault("reader_kill", "Reader 0", 5.0, 5.0)]
    assert cause(err(5.01, started=1.0), faults) == (READER_FAULT, 0)
    assert cause(err(5.01, started=1.0, reader="Reader 1"), faults) == (UNEXPLAINED, None)
    # A kill before this run began explains nothing in it.
    assert cause(err(8.0, started=6.0), faults) == (UNEXPLAINED, None)


def report(**kw) -> dict:
    base = {"mismatches": [], "passes_by_reader": {"Reader 0": 3, "Reader 1": 2},
            "corrupt_chunks": ["web.bin: chunk 3"], "corrupt_reads_refused": 7,
            "partitions_unavailable": None}
    return {**base, **kw}


def judged(errors, faults, ci=False, **kw) -> verdict.Verdict:
    verdict.classify_all(errors, faults, UPSTREAM)
    return verdict.judge(report(**kw), errors, faults, T0, ci)


def test_a_clean_run_passes():
    faults = [fault("host_kill", "host", 10.0, 10.5), fault("replica_kill", "replica0", 20.0, 21.0)]
    v = judged([err(10.1), err(10.2, reader="Reader 1")], faults)
    assert v.ok and v.failures == [] and v.warnings == []
    assert v.text() == "\nVerdict: PASS"


def test_an_unexplained_error_fails_with_its_reader_time_and_the_faults_around_it():
    # Faults within 10 s of the run are printed; the one at 40 s is not.
    faults = [fault("replica_kill", "replica0", 2.0, 3.0), fault("host_kill", "host", 27.0, 27.5),
              fault("host_term", "host", 40.0, 41.0)]
    v = judged([err(18.0, started=12.0, line="error: bad frame")], faults)
    assert not v.ok
    assert v.failures == [
        "unexplained: Reader 0 (reads from host), run from 12.00 s, failed at 18.00 s with exit "
        "1: error: bad frame\n"
        "  fault #0: replica_kill of replica0 at 2.00 s, back at 3.00 s\n"
        "  fault #1: host_kill of host at 27.00 s, back at 27.50 s"]


def test_a_replica_fault_that_reached_a_reader_fails():
    faults = [fault("replica_term", "replica1", 40.0)]
    v = judged([err(41.0, started=35.0)], faults)
    assert v.failures == [
        "replica fault: Reader 0 (reads from host), run from 35.00 s, failed at 41.00 s with "
        "exit 1: error: connection closed\n"
        "  fault #0: replica_term of replica1 at 40.00 s, not back by the end"]


def test_a_second_resume_for_one_host_fault_fails():
    faults = [fault("host_kill", "host", 10.0, 10.5)]
    errors = [err(10.1, started=1.0), err(11.2, started=10.6), err(10.1, reader="Reader 1")]
    v = judged(errors, faults)
    assert [e.cause for e in errors] == [HOST_FAULT, HOST_FAULT, HOST_FAULT]
    assert verdict.most_resumes(errors) == (2, ["Reader 0: 2 resumes for fault #0"])
    assert v.failures == ["more than one resume per host-agent fault: Reader 0: 2 resumes for "
                          "fault #0"]


def test_a_reader_that_never_finished_a_pass_fails():
    v = judged([], [], passes_by_reader={"Reader 0": 4, "PyReader 5": 0})
    assert v.failures == ["never finished a pass: PyReader 5 (more --minutes, or fewer --samples)"]


def test_damage_no_read_met_fails_and_a_differing_stream_fails():
    v = judged([], [], corrupt_reads_refused=0, mismatches=["reader 1 pass 0: 5 bytes differ"])
    assert v.failures == ["stream differs: reader 1 pass 0: 5 bytes differ",
                          "the corrupt replica refused no read: its damage was never met"]


@pytest.mark.parametrize("ci", [True, False])
def test_partitions_unavailable_fail_under_ci_and_warn_outside(ci):
    v = judged([], [], ci=ci, partitions_unavailable="not root")
    msg = "no replica link was cut (partitions unavailable: not root)"
    if ci:
        assert v.failures == [msg + " under CI=true"] and v.warnings == []
    else:
        assert v.ok and v.warnings == [msg]
        assert v.text() == f"\nVerdict: PASS\n- WARNING {msg}"


def test_every_cause_is_counted_and_recorded_as_a_figure():
    faults = [fault("host_kill", "host", 10.0, 10.5), fault("reader_kill", "Reader 1", 20.0, 20.0),
              fault("replica_kill", "replica2", 30.0, 31.0)]
    errors = [err(10.1), err(20.0, started=15.0, reader="Reader 1"), err(30.5, started=25.0),
              err(60.0, started=50.0)]
    verdict.classify_all(errors, faults, UPSTREAM)
    counts = verdict.counts(errors)
    assert counts == {HOST_FAULT: 1, READER_FAULT: 1, REPLICA_FAULT: 1, UNEXPLAINED: 1}
    assert verdict.counts([]) == {HOST_FAULT: 0, READER_FAULT: 0, REPLICA_FAULT: 0,
                                  UNEXPLAINED: 0}
    r = {"faults": {"host_kill": 1, "reader_kill": 1, "replica_kill": 1}, "reader_errors": counts,
         "recovery_s": {}, "readers": 3, "python_readers": 0, "share_groups": 0,
         "mismatches": [], "passes_checked": 4, "bytes_compared": 10**9,
         "corrupt_reads_refused": 3, "corrupt_chunks": ["a"], "passes_by_reader": {"Reader 0": 4},
         "most_resumes_per_host_fault": verdict.most_resumes(errors)[0], "netns": False,
         "partitions_unavailable": "not root"}
    figs = {f["name"]: f for f in chaos.figures(r)}
    assert figs["reader-visible errors caused by replica faults"]["value"] == 1
    assert figs["reader errors no injected fault explains"]["value"] == 1
    assert figs["reader errors no injected fault explains"]["goal"] == "<= 0"
    assert figs["reader errors caused by host-agent faults"]["value"] == 1
    assert figs["reader errors caused by the reader's own SIGKILL"]["value"] == 1
    assert figs["most resumes of one reader for one host-agent fault"]["value"] == 1
    assert figs["replica links cut (partitions)"]["value"] == 0
    assert figs["replica links cut (partitions)"]["baseline"] == \
        "partitions unavailable: not root"


def test_partitions_that_cannot_be_made_are_a_reason_the_verdict_sees(monkeypatch):
    assert chaos.make_nets("off") == ([], "--netns off")
    monkeypatch.setattr(chaos.netns, "available", lambda: False)
    nets, why = chaos.make_nets("auto")
    assert nets == [] and why in ("not root", "no `ip` (iproute2)")
    monkeypatch.setattr(chaos.netns, "available", lambda: True)

    def refused(k):
        raise RuntimeError("ip netns add dqc1n0: Operation not permitted")
    monkeypatch.setattr(chaos.netns, "Netns", refused)
    assert chaos.make_nets("auto") == \
        ([], "namespace creation failed: ip netns add dqc1n0: Operation not permitted")
    with pytest.raises(RuntimeError, match="Operation not permitted"):
        chaos.make_nets("on")
