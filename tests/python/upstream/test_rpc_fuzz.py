"""Hostile RPC clients against an rpc-server with the Spark plugin.

ggml's RPC protocol has no authentication: a server runs whatever graph a client sends it, and
with the plugin (patch 0009) that includes Spark nodes. This test speaks the protocol itself
(rpc_client.py) and sends the cases of rpc_fuzz_cases.py: hostile Spark nodes (wrong shapes,
types and strides, views past their buffers, k = 0, r >= D, huge ne, ne and nb whose byte size
wraps 2^64, no or foreign parameters, unknown op ids), aliased tensors, repeated nodes and
cycles, good nodes (f32 and quantized weights) whose output is checked against numpy, hostile
messages for every command of the patched protocol (patch 0013's extra buffer types included),
GRAPH_RECOMPUTE, truncated and garbage messages; then N_MUTATIONS seeded random mutations of
good nodes.

Each case ends in one of the outcomes of rpc_fuzz_cases.py (refused, answered, nan, ran,
checked) or the server dies: then only a case that expects the one known death in upstream code
passes (KNOWN_UPSTREAM_ABORTS: ggml-cpu asserts the shape rules of a stock op, patches/README.md,
"Known limits"); any other death (a signal, an assert, an AddressSanitizer report) fails the
test, as does a case that hangs, a NaN case without its one op line or with another reason, or
an outcome its case does not expect.

Around every graph case: the tensors lie between guard bytes (rpc_fuzz_specs.Placed), and a byte
outside the nodes' outputs that changed fails the case (a write outside dst); a case that
computed runs again with another guard byte, and an output that differs fails it (a read outside
its inputs). After every case a new client must get the right results (a stock ADD, both FFN
paths and the attention op, against numpy), and at the end the shipped model's greedy text
through `--rpc` must be the local one (test_rpc.py's check). The counts per command and outcome
and every case's outcome are written to tests/out/rpc-fuzz.txt.

The server runs with --cache (SET_TENSOR_HASH has data to name) in a cache directory of the
test's. The plugin prints at most 8 op failure lines per process; the server is started again
before that budget runs out, so every NaN case's line is checked.

AddressSanitizer: `bash tools/asan-rpc.sh` builds ggml, rpc-server and the plugin with ASan and
runs this test against them (SPARK_FUZZ_RPC_SERVER and SPARK_FUZZ_PLUGIN name them; the test's
client tools stay the installed ones)."""

from __future__ import annotations

import os
import platform
import re
import socket
import struct
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from upstream_helpers import (OUT_DIR, exit_status, llama_completion, sibling_module, tail,
                              tool)

rpc = sibling_module("spark_rpc_client", "rpc_client.py")
test_rpc = sibling_module("spark_test_rpc", "test_rpc.py")
specs = sibling_module("spark_rpc_fuzz_specs", "rpc_fuzz_specs.py")
cases_module = sibling_module("spark_rpc_fuzz_cases", "rpc_fuzz_cases.py")
from spark_rpc_fuzz_cases import (  # noqa: E402
    ABORT, ANSWERED, CASE_TIMEOUT, CHECKED, CRASH, N_MUTATIONS, NAN, PARTLY_NAN, RAN,
    REFUSED, SEED, UNTOUCHED, Case, mutations, written_cases)
from spark_rpc_fuzz_specs import (  # noqa: E402
    AH, AN, AS, AT, D, F, LIMITS, OPS, P, SENTINEL, T, TS, Placed, arr, attn_ref,
    ffn_partials, ffn_u, good_attn, good_down, good_sum, ne4, strides)

LINE_BUDGET = 8  # op failure lines the plugin prints per process (cpu_op::MAX_ERROR_LINES)
OP_LINE = re.compile(
    r"^spark-backend: (\S+): layer (\S+): (.*); output (?:set to NaN|not written)$", re.M)
SECOND_GUARD = 0xA5  # the guard byte of a computed case's second run (the first: Placed's)

# The one way a client still ends a server, in upstream code no patch of the series changes
# (patches/README.md, "Known limits"): ggml-cpu asserts, rather than checks, the shape rules
# of the stock op it computes; ggml's constructors keep them in a client, a hostile client
# does not. id: what the server's log shows.
KNOWN_UPSTREAM_ABORTS = {
    "cpu-op-shape-assert": re.compile(
        r"ggml-cpu/(?:ops|binary-ops|unary-ops|ggml-cpu)\.cp?p?:\d+: GGML_ASSERT\([^\n]*\) failed"),
}

ASAN_NEW_OOM = re.compile(
    r"ERROR: AddressSanitizer: allocator is out of memory(?s:.*?) in operator new(?s:.*?) in "
    r"recv_msg ")

DEATHS = (ABORT, CRASH, "crash")


def stock_add_of_unbroadcastable_shapes() -> Case:
    """The pinned known death: a stock ADD of [4] and [3] into [4] (ggml_add would refuse to
    build it: ggml_can_repeat)."""
    def go(c):
        cases_module.hello(c)
        remote, base, _ = cases_module.buffer_of(c)
        a = cases_module.f32s(remote, base, 4)
        b = cases_module.f32s(remote, base + 64, 3)
        dst = cases_module.f32s(remote, base + 128, 4)
        c.graph_compute([rpc.Tensor(dst.type, dst.ne, dst.nb, buffer=remote, data=dst.data,
                                    op=OPS["ADD"], src=[a, b], flags=rpc.FLAG_COMPUTE)])
        c.alignment()
        return RAN
    return Case("graph: a stock ADD whose shapes do not broadcast (known upstream abort)",
                frozenset({ABORT}), raw=go)


# ---------------------------------------------------------------------------------------------
# the server and the good client


@dataclass
class Tally:
    rows: list = field(default_factory=list)  # (case, outcome, detail, command)
    aborts: dict = field(default_factory=dict)  # known id -> [case names]
    failures: list = field(default_factory=list)


@dataclass
class Run:
    """What one run of a graph case gave: outcome, detail, the dst bytes, and the runs of bytes
    that changed outside the nodes' outputs."""
    outcome: str
    detail: str
    out: bytes | None = None
    stray: list = field(default_factory=list)
    aliased: bool = False


class Harness:
    """One rpc-server with the plugin at a time (started again after a death, and before the
    plugin's line budget runs out), and the checks around each case."""

    def __init__(self, workdir: Path, binary: Path | None, plugin: Path | None):
        self.workdir = workdir
        self.binary = binary
        self.plugin = plugin
        self.cache = workdir / "rpc-cache"
        self.starts = 0
        self.server = None
        self.logs: list[Path] = []
        self.start()

    def start(self):
        self.starts += 1
        with pytest.MonkeyPatch.context() as mp:
            if self.plugin:  # the server's plugin only (tool_env reads PLUGIN)
                mp.setattr(sys.modules["upstream_helpers"], "PLUGIN", self.plugin)
            self.server = test_rpc.start_rpc_server(
                self.workdir, True, binary=self.binary, name=f"fuzz{self.starts}",
                extra_args=("--cache",), extra_env={"LLAMA_CACHE": str(self.cache)})
        self.logs.append(self.server.log_path)
        self.seen = 0

    def restart(self):
        self.server.stop()
        self.start()

    def log_since(self) -> str:
        text = self.server.log()
        new, self.seen = text[self.seen:], len(text)
        return new

    def op_lines(self) -> int:
        return len(OP_LINE.findall(self.server.log()))

    def dead_end(self, log: str, rc: int) -> tuple[str, str]:
        """(outcome, detail) of a server that exited: a known upstream abort, else a crash."""
        if ASAN_NEW_OOM.search(log):
            # ASan's operator new reports and aborts where glibc's throws std::bad_alloc, which
            # recv_msg catches (the normal build refuses the message): not a fault of the server
            return REFUSED, "ASan build: operator new out of memory in recv_msg (glibc: bad_alloc)"
        if "AddressSanitizer" in log:
            return "crash", f"AddressSanitizer report (exit {exit_status(rc)})"
        for known, pattern in KNOWN_UPSTREAM_ABORTS.items():
            m = pattern.search(log)
            if m:
                return ABORT, f"{known}: {m.group(0)}"
        return "crash", f"server exited {exit_status(rc)}"

    def good_client(self, rng) -> str | None:
        """None when a new client gets the right results, else what went wrong."""
        try:
            with rpc.Client.connect(self.server.endpoint, CASE_TIMEOUT) as c:
                placed = Placed(c, rng)
                a = TS("F32", (16,), values=np.arange(16, dtype=np.float32))
                b = TS("F32", (16,), values=np.full(16, 0.5, np.float32))
                add_dst = placed.tensor(TS("F32", (16,)))
                add = rpc.Tensor(add_dst.type, add_dst.ne, add_dst.nb, buffer=add_dst.buffer,
                                 data=add_dst.data, op=OPS["ADD"], flags=rpc.FLAG_COMPUTE,
                                 src=[placed.tensor(a), placed.tensor(b)])
                down, fsum, attn = good_down(rng), good_sum(rng), good_attn(rng)
                nodes = [add, placed.node(down.srcs[0]), placed.node(down),
                         placed.node(fsum.srcs[0]), placed.node(fsum), placed.node(attn)]
                c.graph_compute(nodes)
                got = {
                    "add": np.frombuffer(c.get_tensor(add, 64), "<f4"),
                    "up": np.frombuffer(placed.read(down.srcs[0]), "<f4").reshape(F, T),
                    "down": np.frombuffer(placed.read(down), "<f4").reshape(T, D),
                    "fused": np.frombuffer(placed.read(fsum.srcs[0]), "<f4").reshape(P, T, D),
                    "sum": np.frombuffer(placed.read(fsum), "<f4").reshape(T, D),
                    "attn": np.frombuffer(placed.read(attn), "<f4").reshape(AS, AT, AN, AH),
                }
        except (rpc.Closed, OSError, RuntimeError) as e:
            return f"the good client failed: {e!r}"
        u = ffn_u(down.srcs[0])
        want = {"add": np.arange(16) + 0.5, "up": u,
                "down": u.T @ arr(down.srcs[1], (F, D)),
                "fused": ffn_partials(fsum.srcs[0]), "sum": ffn_partials(fsum.srcs[0]).sum(0),
                "attn": attn_ref(attn)}
        bad = [k for k in want if not np.allclose(got[k], want[k], rtol=1e-4, atol=1e-5)]
        if bad:
            return "wrong results for " + ", ".join(
                f"{k} (max error {np.max(np.abs(got[k] - want[k])):.3g})" for k in bad)
        return None

    def settle(self, timeout: float = 5.0) -> int | None:
        """Waits until the server has closed every connection it accepted (its log has as many
        "Client connection closed" as "Accepted client connection" lines: it waits for the next
        client) or has exited; its exit status then."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            rc = self.server.proc.poll()
            if rc is not None:
                return rc
            log = self.server.log()
            if log.count("Accepted client connection") == log.count("Client connection closed"):
                return None
            time.sleep(0.005)
        return self.server.proc.poll()

    def graph_once(self, case: Case, index: int, guard: int) -> tuple[Run, object]:
        """One run of a graph case on a connection of its own, its data from seeds of the case
        (the same in every run) and its buffer cleared to `guard`: (run, the spec sent)."""
        spec = case.node(np.random.default_rng([SEED, index, 1]))
        with rpc.Client.connect(self.server.endpoint, CASE_TIMEOUT) as c:
            placed = Placed(c, np.random.default_rng([SEED, index, 2]), guard)
            node = placed.node(spec)
            before = placed.span()
            c.graph_compute(case.graph(node) if case.graph else [node])
            out = placed.read(spec)
            if out is None:
                c.alignment()  # the graph was computed: the connection still serves
            stray = placed.changed_outside_outputs(before, placed.span())
        outcome, detail = classify(spec, out)
        if case.check is not None and outcome == RAN:
            outcome, detail = compare(spec, out, case.check(spec))
        return Run(outcome, detail, out, stray, placed.aliased), spec

    def run_case(self, case: Case, index: int) -> tuple[str, str, object]:
        """(outcome, detail, the spec of a graph case) of one case, before the server's log is
        read: a graph case that computed runs twice (SECOND_GUARD), and must write nothing
        outside its outputs and give the same output both times (unless its tensors alias)."""
        if case.raw is not None:
            c = rpc.Client(self.server.endpoint, CASE_TIMEOUT)
            try:
                return case.raw(c), "", None
            finally:
                c.close()
        first, spec = self.graph_once(case, index, Placed.GUARD)
        if first.stray:
            return "wrote outside dst", f"bytes changed at (offset, count) {first.stray[:4]}", spec
        if first.out is None or first.outcome not in (RAN, NAN, PARTLY_NAN, CHECKED) \
                or first.aliased or not case.deterministic:
            # (a node whose dst shares bytes with a source reads what its threads wrote: its
            # output may differ from run to run)
            return first.outcome, first.detail, spec
        try:
            second, _ = self.graph_once(case, index, SECOND_GUARD)
        except (rpc.Closed, ConnectionError) as e:
            return "refused on the second run", str(e), spec
        if second.stray:
            return "wrote outside dst", f"second run: bytes changed at {second.stray[:4]}", spec
        if not same_output(first.out, second.out, spec):
            return "read outside its inputs", ("the output changed with the guard bytes "
                                               f"({first.outcome} / {second.outcome})"), spec
        return first.outcome, first.detail, spec

    def run(self, case: Case, index: int) -> tuple[str, str]:
        """Runs one case: (outcome, detail)."""
        if self.op_lines() > LINE_BUDGET - 4:
            self.restart()
        self.settle()
        self.log_since()
        spec = None
        try:
            outcome, detail, spec = self.run_case(case, index)
        except socket.timeout:
            outcome, detail = "hang", f"no answer in {CASE_TIMEOUT} s"
        except (rpc.Closed, ConnectionError) as e:
            outcome, detail = REFUSED, str(e)
        rc = self.settle() if outcome != "hang" else None
        log = self.log_since()
        if rc is not None:
            outcome, detail = self.dead_end(log, rc)
            detail += "\n" + tail(log, 15)
            self.start()
            return outcome, detail
        if outcome == "hang":
            self.server.proc.kill()
            self.server.proc.wait()
            self.start()
            return outcome, detail + "\n" + tail(log, 15)
        if spec is None:
            return outcome, detail
        lines = OP_LINE.findall(log)
        if lines and outcome in (RAN, UNTOUCHED) and detail in ("no output element",
                                                               "dst left as it was",
                                                               "dst over a source"):
            # the op refused a dst it had nothing (or no f32) to fill, or one over a source,
            # whose bytes were not a sentinel to see it untouched by
            outcome = NAN
        if lines and outcome in (RAN, CHECKED):
            return "ran with a failure line", "\n".join(map(str, lines))
        if outcome == NAN and case.why:
            if not lines or any(line[0] != spec.op for line in lines) \
                    or len({line[2] for line in lines}) != 1:
                return "nan without its one line", "\n".join(map(str, lines)) or tail(log, 10)
            if not re.search(case.why, lines[0][2]):
                return "nan for another reason", f"{lines[0][2]!r} does not match {case.why!r}"
            detail = lines[0][2]
        elif lines:
            detail = (detail + " " if detail else "") + lines[0][2]
        return outcome, detail


def classify(spec, out: bytes | None) -> tuple[str, str]:
    """The outcome of a node whose dst region read back as `out`: its elements (by dst's ne and
    nb; padding between them is not dst's) all NaN, some, none, or as they were."""
    if out is None or len(out) == 0:
        return RAN, "no output element"
    if spec.dst.type == "F32" and spec.dst.alias is None:
        ne, nb = ne4(spec.dst.ne), strides(spec.dst)
        if sum((n - 1) * b for n, b in zip(ne, nb)) + 4 > len(out) or overlapping(ne, nb):
            # its elements overlap: the op leaves it as it was
            if out == struct.pack("<f", SENTINEL) * (len(out) // 4) + out[len(out) // 4 * 4:]:
                return UNTOUCHED, "dst left as it was"
            return "written", f"dst ne {ne} nb {nb} reach past its {len(out)} bytes, changed"
        v = np.ndarray(ne[::-1], "<f4", buffer=out, strides=nb[::-1]).ravel()
        if np.isnan(v).all():
            return NAN, ""
        if np.isnan(v).any():
            return PARTLY_NAN, f"{np.isnan(v).sum()} of {v.size} values NaN"
        if (v == SENTINEL).all():
            return UNTOUCHED, "dst left as it was"
        return RAN, f"finite, max |x| {np.abs(v).max():.3g}"
    if spec.dst.alias is not None:
        v = np.frombuffer(out[:len(out) // 4 * 4], "<f4")
        return (NAN, "") if v.size and np.isnan(v).all() else (RAN, "dst over a source")
    if out == b"\xa5" * len(out):
        return UNTOUCHED, "dst left as it was"
    return RAN, "dst (not f32) written"


def overlapping(ne: tuple, nb: tuple, size: int = 4) -> bool:
    """Whether elements of `size` bytes at these strides share bytes: taken by stride, a
    dimension's stride falls short of what the smaller ones address (spark-backend's
    cpu_op::unaddressable, written again here)."""
    addressed = size
    for stride, n in sorted((b, n) for n, b in zip(ne, nb) if n > 1):
        if stride < addressed:
            return True
        addressed += (n - 1) * stride
    return False


def compare(spec, out: bytes, ref) -> tuple[str, str]:
    """CHECKED when the output is the reference's within its tolerance."""
    want, tol = ref
    got = np.frombuffer(out, "<f4").reshape(want.shape)
    scale = max(1.0, float(np.abs(want).max()))
    if np.allclose(got, want, rtol=tol, atol=tol * scale):
        return CHECKED, f"max error {np.abs(got - want).max():.2g} (tolerance {tol:g})"
    return "wrong result", f"max error {np.abs(got - want).max():.3g}, tolerance {tol:g}"


def same_output(a: bytes, b: bytes, spec) -> bool:
    """The same bytes, but for the payload of NaNs (an f32 dst)."""
    if a == b:
        return True
    if spec.dst.type != "F32" or len(a) != len(b) or len(a) % 4:
        return False
    return np.array_equal(np.frombuffer(a, "<f4"), np.frombuffer(b, "<f4"), equal_nan=True)


# ---------------------------------------------------------------------------------------------
# the test


def fuzz_target(variable: str) -> Path | None:
    """SPARK_FUZZ_RPC_SERVER: another rpc-server to attack; SPARK_FUZZ_PLUGIN: another plugin
    for it (the client tools keep the installed one). tools/asan-rpc.sh sets both to its ASan
    builds."""
    path = os.environ.get(variable)
    if not path:
        return None
    if not Path(path).is_file():
        pytest.fail(f"{variable}={path} is not a file", pytrace=False)
    return Path(path)


def offers_repack() -> bool:
    """Whether this machine's ggml-cpu offers the CPU_REPACK buffer type for q4_0 (x86-64 with
    AVX2; on ARM, NEON with i8mm or dotprod)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return False
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    return re.search(r"^flags\s*:.*\bavx2\b", flags, re.M) is not None


def summary_table(rows: list, commands: dict) -> list[str]:
    """Counts per command and outcome category: refused, served (answered, computed and
    checked: nan, ran, checked), server deaths."""
    by = Counter()
    for command, outcome in rows:
        category = ("refused" if outcome == REFUSED else
                    "deaths" if outcome in DEATHS else
                    "served" if outcome in (ANSWERED, NAN, RAN, PARTLY_NAN, CHECKED, UNTOUCHED)
                    else "failed")
        by[(command, category)] += 1
    names = sorted({c for c, _ in rows}, key=lambda c: (c not in commands, c))
    width = max(len(commands.get(c, f"unknown command {c}")) for c in names)
    out = [f"  {'command':<{width}}  refused  served  deaths  failed"]
    for c in names:
        out.append(f"  {commands.get(c, f'unknown command {c}'):<{width}}  "
                   f"{by[(c, 'refused')]:>7}  {by[(c, 'served')]:>6}  {by[(c, 'deaths')]:>6}"
                   f"  {by[(c, 'failed')]:>6}")
    return out


def test_hostile_rpc_clients_get_refusals_or_nan_and_the_server_keeps_serving(
        shipped_f32, tmp_path, monkeypatch):
    tool("rpc-server")  # fails saying how to build the tools when they are missing
    assert (LIMITS["GGML_MAX_DIMS"], LIMITS["GGML_MAX_SRC"], LIMITS["GGML_MAX_OP_PARAMS"],
            LIMITS["GGML_MAX_NAME"]) == (4, 10, 64, 64), f"rpc_tensor's layout changed: {LIMITS}"
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # an abort's gdb backtrace takes seconds
    t0 = time.monotonic()
    harness = Harness(tmp_path, fuzz_target("SPARK_FUZZ_RPC_SERVER"),
                      fuzz_target("SPARK_FUZZ_PLUGIN"))
    tally = Tally()
    try:
        with rpc.Client.connect(harness.server.endpoint) as c:
            version = c.version
            missing = [op for op in ("spark_ffn_up", "spark_ffn_down", "spark_ffn_fused",
                                     "spark_ffn_sum", "spark_attn", "spark_rope")
                       if not c.custom_op_supported(op)]
            extra_types = [name for name, _, _ in c.extra_bufts()]
        assert not missing, harness.server.explain(f"the server has not registered {missing}")
        extra = "CPU_REPACK" in extra_types
        assert extra or not offers_repack(), harness.server.explain(
            f"this CPU has AVX2 but the server offers no CPU_REPACK buffer type: {extra_types}")
        all_cases = written_cases(extra) + [stock_add_of_unbroadcastable_shapes()] \
            + mutations(np.random.default_rng(SEED + 1), N_MUTATIONS)
        problem = harness.good_client(np.random.default_rng(SEED))
        assert problem is None, harness.server.explain(f"before any case: {problem}")
        for index, case in enumerate(all_cases):
            outcome, detail = harness.run(case, index)
            tally.rows.append((case.name, outcome, detail, case.command))
            if outcome in DEATHS:
                tally.aborts.setdefault(detail.splitlines()[0].split(":", 1)[0], []).append(
                    case.name)
            if outcome not in case.expect:
                tally.failures.append(f"{case.name}: {outcome} (want one of "
                                      f"{sorted(case.expect)}): {detail}")
            problem = harness.good_client(np.random.default_rng([SEED, index, 3]))
            if problem is not None:
                tally.failures.append(f"after '{case.name}': {problem}")
                if harness.server.proc.poll() is not None:
                    harness.start()
        # the shipped model through --rpc gives the local text (test_rpc.py's check)
        local, _ = llama_completion(shipped_f32, test_rpc.PROMPT, test_rpc.N_PREDICT, True)
        remote, res = test_rpc.rpc_completion(shipped_f32, [harness.server], True)
        if remote != local:
            tally.failures.append(f"--rpc after the cases gave {remote!r}, locally {local!r}")
    finally:
        harness.server.stop()
    seconds = time.monotonic() - t0
    outcomes = Counter(o for _, o, _, _ in tally.rows)
    deaths = sum(outcomes[o] for o in DEATHS)
    summary = (f"rpc-fuzz: {len(tally.rows)} cases ({len(tally.rows) - N_MUTATIONS} written, "
               f"{N_MUTATIONS} mutations, seed {SEED}; server protocol {version}; extra buffer "
               f"types {extra_types or 'none'}): "
               + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items()))
               + f"; server deaths {deaths} ({outcomes[ABORT]} the known upstream abort); "
               f"{harness.starts} server starts, {seconds:.1f} s"
               + "".join(f"; {v}={os.environ[v]}" for v in ("SPARK_FUZZ_RPC_SERVER",
                                                             "SPARK_FUZZ_PLUGIN")
                         if os.environ.get(v)))
    table = summary_table([(cmd, o) for _, o, _, cmd in tally.rows], rpc.COMMANDS)
    lines = [summary, "by command (served: answered, or computed and checked):", *table,
             "server deaths (patches/README.md, Known limits):"]
    lines += [f"  {k}: {len(names)} ({'; '.join(names)})" for k, names in tally.aborts.items()]
    lines += ["cases:"] + [f"  {o:>15}  {n}  {d.splitlines()[0] if d else ''}"
                           for n, o, d, _ in tally.rows]
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "rpc-fuzz.txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines[:len(table) + 3 + len(tally.aborts)]))
    assert not tally.failures, "\n".join(
        [summary, *tally.failures, f"server logs: {[str(p) for p in harness.logs]}"])
