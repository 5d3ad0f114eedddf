"""Nothing a client sends stops the trainer: loongforge-train on n16-tiny takes
more than 100,000 malformed or hostile control messages from 64 concurrent
connections (random garbage bytes, NUL bytes, invalid UTF-8, partial JSON,
valid JSON with wrong types, unknown verbs, deeply nested JSON, lines over
64 KiB, requests before the handshake, slow clients that stall mid-line,
clients that hang up before or while their replies arrive, clients that flood
without reading) and

  - keeps training: steps/s while fuzzed stay >= MIN_SPEED_RATIO of the
    undisturbed rate measured just before;
  - keeps its memory bounded: peak RSS during the fuzz stays within
    MAX_RSS_GROWTH_MB of the RSS before it, and every client connection is
    closed afterwards (the trainer's fd count returns to its baseline);
  - answers every line it can use with a reply of the expected code (or ok),
    matched by id, or sends an error line and closes; the exact byte limit of
    a line (64 KiB, newline included) is honoured on both sides;
  - still answers a plain `status` at the end, and a client that hangs up
    while its request waits for a step boundary costs the control thread no
    CPU.

The figures (messages, replies, duration, steps/s before and during, RSS
before/peak/after, VmHWM) are printed and, when LOONGFORGE_FUZZ_REPORT names
a file, written there as JSON.

Environment as in trainer_harness.py; LOONGFORGE_FUZZ_SEED (default 20240611)
makes a run reproducible.
"""
import json
import os
import random
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from trainer_harness import PROTOCOL, Trainer, status

SEED = int(os.environ.get("LOONGFORGE_FUZZ_SEED", "20240611"))
MAX_LINE = 64 * 1024        # kMaxLineBytes, newline included
LINE_TIMEOUT_S = 5.0        # ServerOptions::line_timeout_ms
WORKERS = 64                # concurrent fuzzing connections
SLOW_CLIENTS = 8            # stalled mid-line, on top of the workers
FLOOD_CLIENTS = 2           # pipeline without reading, on top of the workers
MIN_REPLIES = 105_000       # the issue asks for 100,000 messages; we count those answered (plus margin)
MIN_FUZZ_S = 10.0           # long enough to measure steps/s while fuzzed
MAX_FUZZ_S = 60.0
# Thresholds, measured on the 2-core CI box (fuzzer, trainer and its control
# thread share the two cores): ~15 steps/s undisturbed, 0.68x while fuzzed at
# ~33,000 messages/s (0.34x when another test's trainers also ran); RSS grows
# by ~30 MB (by 730 MB before the server bounded a flooding client's replies).
# The speed bound leaves 2x margin on a quiet box; the RSS bound is ~7x the
# figure and well under what a leak or unbounded reply buffer produces.
MIN_SPEED_RATIO = 0.3
MAX_RSS_GROWTH_MB = 200

OK = "ok"
TASK_BUSY = "busy"  # task verbs may be refused when the per-client or global queue is full


def req(id_, verb, args=None, **extra):
    d = {"v": PROTOCOL, "id": id_, "verb": verb}
    if args is not None:
        d["args"] = args
    d.update(extra)
    return json.dumps(d, separators=(",", ":")).encode()


# Big lines, built once (each < 64 KiB with its newline).
DEEP_ARRAY_ARGS = b'{"a":' + b"[" * 30000 + b"]" * 30000 + b"}"
DEEP_OBJECT_ARGS = b'{"a":' * 8000 + b"1" + b"}" * 8000
DEEP_UNBALANCED = b"[" * 65000


def deep_request(id_, verb, args_bytes):
    return b'{"v":1,"id":%d,"verb":"%s","args":%s}' % (id_, verb.encode(), args_bytes)


def padded_status(id_, total_with_newline):
    head = b'{"v":1,"id":%d,"verb":"status","args":{},"pad":"' % id_
    pad = total_with_newline - 1 - len(head) - 2
    return head + b"x" * pad + b'"}'


class Line:
    """One line we send and what the server must answer: `id` (0 when the
    server cannot read one) and the codes it may answer with ("ok" for a
    success)."""
    __slots__ = ("data", "id", "codes", "kind")

    def __init__(self, data, id_, codes, kind):
        assert b"\n" not in data and data not in (b"", b"\r")
        self.data, self.id, self.codes, self.kind = data, id_, frozenset(codes), kind


def hostile_line(rng, id_):
    """A random line of one of the hostile categories, with its expected answer."""
    r = rng.random()
    if r < 0.16:  # random garbage bytes
        b = rng.randbytes(rng.randint(1, 300)).replace(b"\n", b"?")
        return Line(b if b != b"\r" else b"\x00", 0, {"bad_request"}, "garbage")
    if r < 0.26:  # a valid request cut short
        full = req(id_, rng.choice(["status", "profile-step", "hello", "stop"]), {"duration_s": 1})
        return Line(full[: rng.randint(1, len(full) - 1)], 0, {"bad_request"}, "partial_json")
    if r < 0.30:  # NUL bytes, alone or inside a string
        if rng.random() < 0.5:
            return Line(b"\x00" * rng.randint(1, 64), 0, {"bad_request"}, "nul_bytes")
        return Line(b'{"v":1,"id":%d,"verb":"sta\x00tus"}' % id_, 0, {"bad_request"}, "nul_bytes")
    if r < 0.35:  # invalid UTF-8 inside JSON strings (nlohmann rejects it while parsing)
        bad = rng.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80abc", b"\\ud800"])
        where = rng.choice([b'{"v":1,"id":%d,"verb":"%s"}', b'{"v":1,"id":%d,"verb":"status","args":{"k":"%s"}}'])
        return Line(where % (id_, bad), 0, {"bad_request"}, "invalid_utf8")
    if r < 0.55:  # valid JSON, wrong types or fields
        k = rng.randrange(11)
        if k == 0:
            return Line(json.dumps({"v": 1, "id": str(id_), "verb": "status"}).encode(), 0, {"bad_request"}, "id_string")
        if k == 1:
            return Line(json.dumps({"v": 1, "id": -id_, "verb": "status"}).encode(), 0, {"bad_request"}, "id_negative")
        if k == 2:
            return Line(json.dumps({"v": 1, "id": id_ + 0.5, "verb": "status"}).encode(), 0, {"bad_request"}, "id_float")
        if k == 3:
            return Line(json.dumps({"id": id_, "verb": "status"}).encode(), id_, {"bad_request"}, "v_missing")
        if k == 4:
            return Line(json.dumps({"v": "1", "id": id_, "verb": "status"}).encode(), id_, {"bad_request"}, "v_string")
        if k == 5:
            return Line(req(id_, "status", v=rng.choice([0, 2, 99, -1, 1 << 40])), id_, {"version_mismatch"}, "v_mismatch")
        if k == 6:
            args = rng.choice([[1, 2], "x", 7, None, True])
            return Line(json.dumps({"v": 1, "id": id_, "verb": "status", "args": args}).encode(), id_, {"bad_request"},
                        "args_not_object")
        if k == 7:
            return Line(json.dumps({"v": 1, "id": id_, "verb": rng.choice([7, None, [], {}, ""])}).encode(), id_,
                        {"bad_request"}, "verb_not_string")
        if k == 8:
            return Line(json.dumps(rng.choice([[1, 2, 3], "status", 42, None, True])).encode(), 0, {"bad_request"}, "not_object")
        if k == 9:
            return Line(json.dumps({"v": 1, "id": 10**30, "verb": "status"}).encode(), 0, {"bad_request"}, "id_huge")
        return Line(json.dumps({"v": 1, "id": id_}).encode(), id_, {"bad_request"}, "verb_missing")
    if r < 0.70:  # unknown verbs (hello again after the handshake is one too)
        verb = rng.choice(["hello", "STATUS", "rm -rf /", "status ", "no-such-verb-%d" % rng.randrange(10**6),
                           "\u00e9\u00e8" * 40, "x" * 500])
        return Line(req(id_, verb), id_, {"unknown_verb"}, "unknown_verb")
    if r < 0.80:  # known verbs with bad arguments or engines not in this build
        k = rng.randrange(6)
        if k == 0:
            return Line(req(id_, "mla-stats"), id_, {"engine_off"}, "engine_off")
        if k == 1:
            return Line(req(id_, "monitor-comm", {"interval_s": rng.choice([0.0, -1, "x", 1e9])}), id_, {"bad_args"}, "bad_args")
        if k == 2:
            return Line(req(id_, "monitor-comm", {"interval_s": 1}), id_, {"engine_off"}, "engine_off")
        if k == 3:
            return Line(req(id_, "switch-strategy", {"strategy": rng.choice(["", "bogus", "SIMPLE"])}), id_,
                        {"bad_args", TASK_BUSY}, "bad_args_task")
        if k == 4:
            return Line(req(id_, "profile-step", rng.choice([{"duration_s": "x"}, {"duration_s": -1}, {"max_steps": 0},
                                                            {"max_steps": 1.5}])), id_, {"bad_args", TASK_BUSY}, "bad_args_task")
        return Line(req(id_, rng.choice(["hot-rejoin", "debug-dmf"])), id_, {"engine_off", TASK_BUSY}, "engine_off_task")
    if r < 0.805:  # deeply nested JSON within 64 KiB
        k = rng.randrange(4)
        if k == 0:
            return Line(deep_request(id_, "status", DEEP_ARRAY_ARGS), id_, {OK}, "deep_json")
        if k == 1:
            return Line(deep_request(id_, "status", DEEP_OBJECT_ARGS), id_, {OK}, "deep_json")
        if k == 2:
            return Line(deep_request(id_, "hot-rejoin", DEEP_ARRAY_ARGS), id_, {"engine_off", TASK_BUSY}, "deep_json")
        return Line(DEEP_UNBALANCED, 0, {"bad_request"}, "deep_json")
    # valid status requests interleaved
    return Line(req(id_, "status", rng.choice([None, {}, {"extra": [1, 2, 3]}])), id_, {OK}, "status")


class Stats:
    def __init__(self):
        self.mu = threading.Lock()
        self.sent = Counter()      # messages (lines, or partial lines) sent, by category
        self.replies = 0
        self.codes = Counter()
        self.sessions = Counter()
        self.closes = Counter()    # how connections that the server closed ended: eof / reset
        self.failures = []
        self.flood_bytes = 0
        self.flood_replies = 0

    def add(self, sent=None, replies=0, codes=None, session=None, close=None):
        with self.mu:
            if sent:
                self.sent.update(sent)
            self.replies += replies
            if codes:
                self.codes.update(codes)
            if session:
                self.sessions[session] += 1
            if close:
                self.closes[close] += 1

    def fail(self, msg):
        with self.mu:
            if len(self.failures) < 50:
                self.failures.append(msg)

    @property
    def messages(self):
        return sum(self.sent.values())


class Conn:
    """A raw connection that reads reply lines and tells a close from a timeout."""

    def __init__(self, path, timeout=30.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        self.buf = b""
        self.closed_how = None  # "eof" or "reset" once the server closed

    def send(self, data):
        """sendall; False when the server had already closed (EPIPE/ECONNRESET)."""
        try:
            self.s.sendall(data)
            return True
        except (BrokenPipeError, ConnectionResetError):
            return False

    def line(self, partial_ok=False):
        """The next reply as a dict, or None once the server closed (a server
        that drops a slow reader may cut its last line: `partial_ok`)."""
        while b"\n" not in self.buf:
            if self.closed_how:
                return None
            try:
                chunk = self.s.recv(1 << 20)
            except ConnectionResetError:
                chunk, self.closed_how = b"", "reset"
            if not chunk:
                self.closed_how = self.closed_how or "eof"
                if self.buf and not partial_ok:
                    raise AssertionError(f"server closed after a partial reply line {self.buf[:200]!r}")
                return None
            self.buf += chunk
        raw, self.buf = self.buf.split(b"\n", 1)
        r = json.loads(raw)
        assert isinstance(r, dict) and r.get("v") == PROTOCOL and isinstance(r.get("ok"), bool), raw[:300]
        assert isinstance(r.get("id"), int), raw[:300]
        if not r["ok"]:
            e = r.get("error")
            assert isinstance(e, dict) and isinstance(e.get("code"), str) and e.get("message"), raw[:300]
        return r

    def close(self):
        self.s.close()


def code_of(r):
    return OK if r["ok"] else r["error"]["code"]


def hello_line():
    return req(0, "hello", {"client": "fuzz"}) + b"\n"


def expect_error_then_close(c, codes, what):
    """The server answers one error line with one of `codes`, then closes."""
    r = c.line()
    assert r is not None, f"{what}: closed without an error reply"
    assert not r["ok"] and r["error"]["code"] in codes, f"{what}: got {r}"
    extra = c.line()
    assert extra is None, f"{what}: expected a close after {r['error']['code']}, got {extra}"
    return r["error"]["code"]


# ---------------------------------------------------------------------------
# Sessions: one connection each, run back to back by the workers.

def session_batch(path, rng, stats):
    """Handshake, then pipelined hostile lines (one sendall); every line gets
    exactly one reply, matched by id (id 0 when the line had none readable)."""
    c = Conn(path)
    try:
        c.send(hello_line())
        r = c.line()
        if r is not None and not r["ok"] and r["error"]["code"] == "busy":  # too many clients: error + close
            assert c.line() is None
            stats.add(sent={"hello": 1}, replies=1, codes={"busy": 1}, session="batch_refused", close=c.closed_how)
            return
        assert r is not None and r["ok"] and r["id"] == 0 and r["result"]["server"] == "loongforge-train", r
        sent, codes = Counter({"hello": 1}), Counter({OK: 1})
        for _round in range(1 if rng.random() < 0.9 else 3):
            lines = [hostile_line(rng, i) for i in range(1, rng.randint(50, 400))]
            by_id = {ln.id: ln for ln in lines if ln.id}
            zero_expected = Counter(next(iter(ln.codes)) for ln in lines if not ln.id)
            zero_got = Counter()
            assert c.send(b"\n".join(ln.data for ln in lines) + b"\n"), "server closed a greeted connection"
            sent.update(ln.kind for ln in lines)
            for _ in range(len(lines)):
                r = c.line()
                assert r is not None, f"closed with replies missing (kinds {Counter(l.kind for l in lines)})"
                code = code_of(r)
                codes[code] += 1
                if r["id"] == 0:
                    zero_got[code] += 1
                    continue
                ln = by_id.pop(r["id"], None)
                assert ln is not None, f"reply to an id we did not send (or twice): {r}"
                assert code in ln.codes, f"{ln.kind} line {ln.data[:120]!r} answered {r}"
                if code == OK:
                    assert isinstance(r["result"].get("step"), int), r
            assert not by_id and zero_got == zero_expected, (by_id, zero_got, zero_expected)
        stats.add(sent=sent, replies=sum(codes.values()), codes=codes, session="batch")
    finally:
        c.close()


def session_no_hello(path, rng, stats):
    """A first line other than a well-formed hello: one error reply, then a close.
    Lines pipelined behind it are never answered."""
    k = rng.randrange(4)
    first, codes = [(req(1, "status"), {"handshake_required"}),
                    (rng.randbytes(40).replace(b"\n", b"?") + b"x", {"bad_request"}),
                    (req(0, "hello", v=99), {"version_mismatch"}),
                    (req(0, "hello")[:-3], {"bad_request"})][k]
    behind = [req(i, "status") for i in range(2, rng.randint(2, 6))]
    c = Conn(path)
    try:
        c.send(b"\n".join([first, *behind]) + b"\n")
        code = expect_error_then_close(c, codes | {"busy"}, "no_hello")
        stats.add(sent={"before_hello": 1 + len(behind)}, replies=1, codes={code: 1}, session="no_hello", close=c.closed_how)
    finally:
        c.close()


def session_huge_line(path, rng, stats):
    """A line over 64 KiB (with or without its newline, before or after the
    handshake): line_too_long, then a close."""
    greeted = rng.random() < 0.8
    c = Conn(path)
    try:
        replies = Counter()
        if greeted:
            c.send(hello_line())
            r = c.line()
            if r is None or not r["ok"]:
                return
            replies[OK] += 1
        size = rng.choice([MAX_LINE, MAX_LINE + 1, rng.randint(MAX_LINE, 4 * MAX_LINE), 1 << 20])
        body = rng.choice([b"a", b"{", b"\x00", b" "]) * size
        c.send(body + (b"\n" if rng.random() < 0.5 else b""))  # may fail: the server closes mid-send
        code = expect_error_then_close(c, {"line_too_long"}, f"huge line of {size} bytes")
        replies[code] += 1
        stats.add(sent={"huge_line": 1 + greeted}, replies=sum(replies.values()), codes=replies,
                  session="huge_line", close=c.closed_how)
    finally:
        c.close()


def session_boundary(path, rng, stats):
    """A status request of exactly 64 KiB with its newline is answered; one byte
    more is line_too_long and a close."""
    c = Conn(path)
    try:
        c.send(hello_line())
        assert c.line()["ok"]
        c.send(padded_status(1, MAX_LINE) + b"\n")
        r = c.line()
        assert r["ok"] and r["id"] == 1, r
        c.send(padded_status(2, MAX_LINE + 1) + b"\n")
        code = expect_error_then_close(c, {"line_too_long"}, "64 KiB + 1")
        stats.add(sent={"hello": 1, "boundary": 2}, replies=3, codes={OK: 2, code: 1}, session="boundary",
                  close=c.closed_how)
    finally:
        c.close()


def session_disconnect(path, rng, stats):
    """Hang up before or while the replies come: after connecting, after the
    hello, after many pipelined status requests (unread or half read), after a
    request that waits for a step boundary, or in the middle of a line."""
    k = rng.randrange(6)
    c = Conn(path)
    sent = Counter()
    try:
        if k == 0:
            pass  # connect, say nothing, leave
        elif k == 1:
            c.send(hello_line())
            sent["hello"] += 1
        else:
            c.send(hello_line())
            sent["hello"] += 1
            if k in (2, 3):
                n = rng.randint(100, 600)
                c.send(b"".join(req(i, "status") + b"\n" for i in range(1, n + 1)))
                sent["status_then_hangup"] += n
                if k == 3:
                    for _ in range(rng.randint(1, n // 2)):
                        if c.line() is None:
                            break
            elif k == 4:
                verb, args = rng.choice([("profile-step", {"duration_s": 0.2, "max_steps": 3}),
                                         ("switch-strategy", {"strategy": "x"}), ("hot-rejoin", {})])
                c.send(req(1, verb, args) + b"\n")
                sent["task_then_hangup"] += 1
            else:
                c.send(b'{"v":1,"id":1,"verb":"stat')
                sent["partial_then_hangup"] += 1
        stats.add(sent=sent, session="disconnect")
    finally:
        c.close()


SESSIONS = [(session_batch, 0.80), (session_no_hello, 0.05), (session_huge_line, 0.035), (session_boundary, 0.005),
            (session_disconnect, 0.11)]


def worker(path, seed, stats, stop):
    rng = random.Random(seed)
    fns, weights = zip(*SESSIONS)
    while not stop.is_set():
        fn = rng.choices(fns, weights)[0]
        try:
            fn(path, rng, stats)
        except Exception as e:  # recorded, asserted in the test
            stats.fail(f"{fn.__name__}: {type(e).__name__}: {e}"[:600])


def slow_client(path, greeted, stats):
    """Sends part of a line and stalls: a timeout error after line_timeout_ms
    from the line's first byte, then a close."""
    try:
        c = Conn(path, timeout=LINE_TIMEOUT_S + 15)
        try:
            if greeted:
                c.send(hello_line())
                assert c.line()["ok"]
            t0 = time.monotonic()
            c.send(b'{"v":1,"id":7,"verb":"sta')
            code = expect_error_then_close(c, {"timeout"}, "stalled mid-line")
            waited = time.monotonic() - t0
            assert LINE_TIMEOUT_S - 0.5 <= waited <= LINE_TIMEOUT_S + 5, f"timeout after {waited:.2f} s"
            stats.add(sent={"slow_partial": 1 + greeted}, replies=1 + greeted, codes={code: 1, OK: greeted},
                      session="slow", close=c.closed_how)
        finally:
            c.close()
    except Exception as e:
        stats.fail(f"slow_client: {type(e).__name__}: {e}"[:600])


def trickle_client(path, stats):
    """A slow but honest client: a status request in three pieces over 1.5 s is answered."""
    try:
        c = Conn(path)
        try:
            c.send(hello_line())
            assert c.line()["ok"]
            line = req(1, "status") + b"\n"
            for piece in (line[:5], line[5:20], line[20:]):
                c.send(piece)
                time.sleep(0.5)
            r = c.line()
            assert r["ok"] and r["id"] == 1 and "step" in r["result"], r
            stats.add(sent={"trickle": 2}, replies=2, codes={OK: 2}, session="trickle")
        finally:
            c.close()
    except Exception as e:
        stats.fail(f"trickle_client: {type(e).__name__}: {e}"[:600])


def flood_client(path, stats, max_bytes=8 << 20):
    """Pipelines one-byte bad lines without reading: the server must close it as
    a slow reader once its unsent replies pass max_outbox_bytes (4 MiB), not
    buffer replies for everything it is sent."""
    try:
        c = Conn(path, timeout=30)
        try:
            c.send(hello_line())
            assert c.line()["ok"]
            chunk, sent = b"x\n" * 8192, 0
            while sent < max_bytes and c.send(chunk):
                sent += len(chunk)
            assert sent < max_bytes, f"the server read {sent >> 20} MiB from a client that never reads its replies"
            n = 0
            while (r := c.line(partial_ok=True)) is not None:
                assert not r["ok"] and r["error"]["code"] == "bad_request", r
                n += 1
            with stats.mu:
                stats.flood_bytes += sent
                stats.flood_replies += n
            stats.add(session="flood", close=c.closed_how)
        finally:
            c.close()
    except Exception as e:
        stats.fail(f"flood_client: {type(e).__name__}: {e}"[:600])


# ---------------------------------------------------------------------------
# Process figures

def fd_count(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def thread_cpu_s(pid):
    """CPU seconds per thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        out[int(tid)] = (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    return out


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    t = Trainer(tmp_path_factory.mktemp("fuzz"))
    try:
        t.wait_for_socket()
        t.wait_for_step(5)
        yield t
    finally:
        t.kill()


def test_the_trainer_keeps_training_with_bounded_memory_under_100k_hostile_messages(trainer):
    t, pid = trainer, trainer.proc.pid

    # Undisturbed rate.
    s0, t0 = t.steps_done(), time.monotonic()
    time.sleep(8)
    base_rate = (t.steps_done() - s0) / (time.monotonic() - t0)
    assert base_rate > 1, f"the trainer makes only {base_rate:.2f} steps/s before any fuzzing:\n{t.output()[-2000:]}"
    rss_before, fds_before = t.rss_kb(), fd_count(pid)

    stats, stop = Stats(), threading.Event()
    rss_samples = []
    fuzz_done = threading.Event()

    def sample_rss():
        while not fuzz_done.is_set():
            rss_samples.append(t.rss_kb())
            time.sleep(0.5)

    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    f_steps0, f_t0 = t.steps_done(), time.monotonic()
    cpu0, me0 = thread_cpu_s(pid), os.times()
    side = [threading.Thread(target=slow_client, args=(t.socket, i % 4 != 0, stats)) for i in range(SLOW_CLIENTS)]
    side += [threading.Thread(target=flood_client, args=(t.socket, stats)) for _ in range(FLOOD_CLIENTS)]
    side += [threading.Thread(target=trickle_client, args=(t.socket, stats))]
    workers = [threading.Thread(target=worker, args=(t.socket, SEED * 1000 + i, stats, stop)) for i in range(WORKERS)]
    for th in side + workers:
        th.start()
    while True:
        time.sleep(0.2)
        elapsed = time.monotonic() - f_t0
        assert t.proc.poll() is None, f"the trainer died under fuzzing:\n{t.output()[-3000:]}"
        if (stats.replies >= MIN_REPLIES and elapsed >= MIN_FUZZ_S) or elapsed > MAX_FUZZ_S:
            break
    stop.set()
    for th in workers + side:
        th.join(timeout=60)
        assert not th.is_alive(), "a fuzzing client hangs: the server neither answered nor closed"
    fuzz_s = time.monotonic() - f_t0
    fuzz_rate = (t.steps_done() - f_steps0) / fuzz_s
    cpu1, me1 = thread_cpu_s(pid), os.times()
    train_cpu = cpu1.get(pid, 0) - cpu0.get(pid, 0)
    other_cpu = sum(v - cpu0.get(k, 0) for k, v in cpu1.items() if k != pid)
    fuzzer_cpu = (me1.user + me1.system) - (me0.user + me0.system)
    fuzz_done.set()
    sampler.join()
    rss_peak = max(rss_samples + [t.rss_kb()])

    # Every connection is gone again: nothing leaked on the server side.
    deadline = time.monotonic() + 10
    while fd_count(pid) > fds_before and time.monotonic() < deadline:
        time.sleep(0.2)
    fds_after = fd_count(pid)
    final = status(t.socket)
    time.sleep(1)
    alive = t.proc.poll() is None
    rss_after, hwm = t.rss_kb(), t.hwm_kb()

    figures = {
        "seed": SEED, "messages_sent": stats.messages, "replies_received": stats.replies,
        "by_category": dict(stats.sent), "reply_codes": dict(stats.codes), "sessions": dict(stats.sessions),
        "server_closes_seen": dict(stats.closes), "flood_bytes_sent": stats.flood_bytes,
        "flood_replies_read": stats.flood_replies, "concurrent_clients": WORKERS + SLOW_CLIENTS + FLOOD_CLIENTS + 1,
        "fuzz_duration_s": round(fuzz_s, 2), "messages_per_s": round(stats.messages / fuzz_s),
        "steps_per_s_before": round(base_rate, 2), "steps_per_s_during": round(fuzz_rate, 2),
        "speed_ratio": round(fuzz_rate / base_rate, 3), "rss_mb_before": round(rss_before / 1024, 1),
        "rss_mb_peak": round(rss_peak / 1024, 1), "rss_mb_after": round(rss_after / 1024, 1),
        "rss_growth_mb": round((rss_peak - rss_before) / 1024, 1), "vmhwm_mb": round(hwm / 1024, 1),
        "cpu_s_training_thread": round(train_cpu, 2), "cpu_s_other_trainer_threads": round(other_cpu, 2),
        "cpu_s_fuzzer": round(fuzzer_cpu, 2), "fds_before": fds_before, "fds_after": fds_after, "final_status_step": final.get("step"), "server_counters": final.get("control"),
        "failures": len(stats.failures),
    }
    print("\ncontrol fuzz figures:", json.dumps(figures, sort_keys=True))
    if os.environ.get("LOONGFORGE_FUZZ_REPORT"):
        Path(os.environ["LOONGFORGE_FUZZ_REPORT"]).write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")

    assert not stats.failures, "clients saw wrong or missing replies:\n" + "\n".join(stats.failures[:10])
    assert stats.messages >= stats.replies >= 100_000  # every answered line counted once; hang-ups go unanswered
    assert stats.sessions["slow"] == SLOW_CLIENTS and stats.sessions["flood"] == FLOOD_CLIENTS
    assert alive, f"the trainer exited:\n{t.output()[-3000:]}"
    assert final["phase"] == "training" and final["step"] > f_steps0
    assert fuzz_rate >= MIN_SPEED_RATIO * base_rate, \
        f"training slowed from {base_rate:.2f} to {fuzz_rate:.2f} steps/s under fuzzing"
    assert rss_peak - rss_before < MAX_RSS_GROWTH_MB * 1024, \
        f"RSS grew by {(rss_peak - rss_before) / 1024:.0f} MB under fuzzing (bound {MAX_RSS_GROWTH_MB} MB)"
    assert fds_after <= fds_before, f"{fds_after - fds_before} client connections stay open after the fuzz"


def test_a_client_that_hangs_up_while_its_request_waits_costs_the_control_thread_no_cpu(trainer):
    t, pid = trainer, trainer.proc.pid
    c = Conn(t.socket)
    c.send(hello_line())
    assert c.line()["ok"]
    c.send(req(1, "profile-step", {"duration_s": 4, "max_steps": 100000}) + b"\n")
    time.sleep(0.5)  # the profile has started at a step boundary; its reply is due in ~4 s
    c.close()
    other = Conn(t.socket)
    other.send(hello_line())
    assert other.line()["ok"]
    other.send(req(1, "profile-step", {"duration_s": 1}) + b"\n")
    r = other.line()
    other.close()
    assert not r["ok"] and r["error"]["code"] == "busy" and "already" in r["error"]["message"], r  # still pending
    time.sleep(0.3)
    before = thread_cpu_s(pid)
    time.sleep(2)
    after = thread_cpu_s(pid)
    others = sum(after[tid] - before.get(tid, 0) for tid in after if tid != pid)
    assert others < 0.3, f"threads besides the training thread used {others:.2f} CPU s in 2 s (control thread spinning?)"
    time.sleep(2)  # the profile ends; its reply goes nowhere
    assert status(t.socket)["phase"] == "training"


def test_a_switch_strategy_whose_strategy_is_not_a_string_is_answered_bad_args(trainer):
    c = Conn(trainer.socket)
    try:
        c.send(hello_line())
        assert c.line()["ok"]
        c.send(req(1, "switch-strategy", {"strategy": 7}) + b"\n")
        r = c.line()
        assert not r["ok"] and r["error"]["code"] == "bad_args", r
    finally:
        c.close()
