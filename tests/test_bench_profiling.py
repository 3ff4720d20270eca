"""bench/profiling.py: what the benchmarks' --profile reports is read right from py-spy's and the
kernel's text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import profiling  # noqa: E402


def test_top_frames_self_and_inclusive(tmp_path):
    raw = tmp_path / "a.txt"
    raw.write_text("main (a.py:1);loop (a.py:2);recv (a.py:3) 6\n"
                   "main (a.py:1);loop (a.py:2);send (a.py:4) 3\n"
                   "main (a.py:1);loop (a.py:2);loop (a.py:2) 1\n"
                   "not a stack line\n")
    other = tmp_path / "b.txt"
    other.write_text("main (a.py:1);recv (a.py:3) 10\n")
    assert profiling.top_frames([raw]) == [("recv (a.py:3)", 60.0), ("send (a.py:4)", 30.0), ("loop (a.py:2)", 10.0)]
    inclusive = dict(profiling.top_frames([raw, other], inclusive=True))
    # a frame twice on one stack (recursion) counts once for it
    assert inclusive == {"main (a.py:1)": 100.0, "loop (a.py:2)": 50.0, "recv (a.py:3)": 80.0, "send (a.py:4)": 15.0}
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert profiling.top_frames([empty]) == []


class FakeNs:
    def __init__(self, text: str) -> None:
        self.text = text

    def run(self, cmd, check=True, **kw):
        return subprocess.CompletedProcess(cmd, 0, stdout=self.text, stderr="")


def test_snmp_reads_the_counters_and_delta_keeps_what_moved():
    before = profiling.snmp(FakeNs(
        "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
        "Udp: 100 0 5 90 5 0\n"
        "Tcp: RtoAlgorithm InSegs OutSegs RetransSegs\n"
        "Tcp: 1 10 20 1\n"
        "TcpExt: SyncookiesSent TCPLossProbes TCPOFOQueue\n"
        "TcpExt: 0 2 7\n"))
    assert before == {"Udp.InDatagrams": 100, "Udp.InErrors": 5, "Udp.OutDatagrams": 90, "Udp.RcvbufErrors": 5,
                      "Udp.SndbufErrors": 0, "Tcp.InSegs": 10, "Tcp.OutSegs": 20, "Tcp.RetransSegs": 1,
                      "TcpExt.TCPLossProbes": 2, "TcpExt.TCPOFOQueue": 7}
    after = {**before, "Udp.RcvbufErrors": 45, "Tcp.RetransSegs": 4}
    assert profiling.delta(before, after) == {"Udp.RcvbufErrors": 40, "Tcp.RetransSegs": 3}


def test_ss_lines_give_the_algorithm_and_the_window():
    line = ("\t ts sack cubic wscale:10,10 rto:228 rtt:26.02/1.402 mss:1368 cwnd:258 ssthresh:178 "
            "pacing_rate 120.5Mbps delivery_rate 98.1Mbps retrans:0/41")
    assert profiling._SS_CC.search(line).group(1) == "cubic"
    assert profiling._SS_CC.search("\t bbr wscale:7,7 rto:204").group(1) == "bbr"
    found = {k: float(m.group(1)) for k, rx in profiling._SS_FIELDS.items() if (m := rx.search(line))}
    assert found == {"cwnd": 258, "rtt_ms": 26.02, "retrans": 41, "pacing_mbit": 120.5, "delivery_mbit": 98.1}
