#!/usr/bin/env python3
"""Run a command with a given amount of memory left to it: a memory budget anyone can set.

    .venv/bin/python tools/memory-budget.py --leave GB [--evict FILE]... [--quiet] -- CMD [ARG]...
    .venv/bin/python tools/memory-budget.py --evict FILE...
    .venv/bin/python tools/memory-budget.py --sizes MODEL.gguf

--leave GB: this process takes MemAvailable - GB of anonymous memory, touches every page of it
(and locks it where RLIMIT_MEMLOCK allows, so that a machine with swap cannot page it out), then
runs CMD and gives the memory back when CMD ends. The kernel has to find CMD's memory, page
cache included, within what is left: a model file that does not fit is read from storage again
as it is used, as on a machine with that much memory. Nothing outside this process and CMD is
changed (no cgroup, no drop_caches, no swap settings). The holder asks the kernel's
out-of-memory killer to spare it (oom_score_adj -1000, where allowed), so a CMD that does not
fit is what gets killed, as it would be on a smaller machine; its exit status is CMD's.

--evict FILE: before CMD starts, FILE's pages are dropped from the page cache
(posix_fadvise DONTNEED, this file only), so that CMD starts cold whatever ran before. Without
--leave and CMD, it only does that.

--sizes MODEL.gguf prints the file's bytes split as a Spark decode step reads them (docs/SPEC.md
section 3): `always` (every tensor but the FFN rows: attention, K1 = ffn_gate, the norms and the
token embedding, which is also the output matrix) and `rows` (K2 = ffn_up and V = ffn_down_t,
or both side by side in ffn_k2v, of which a token reads only the kept neurons' rows); for a stock
file everything is `always`.
In GB (1e9 bytes), one `name value` pair per line, for scripts (tools/bench-memory.sh).

Progress goes to stderr (--quiet: none). Exit status: CMD's, or 1 when the budget cannot be set
(less is available than asked to leave, or the memory cannot be had), 2 usage error.
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import subprocess
import sys
from pathlib import Path

PROG = "memory-budget.py"
GB = 1e9
PAGE = mmap.PAGESIZE


class Failure(Exception):
    """Exit status 1, with a message naming what failed."""


def mem_available() -> int:
    """MemAvailable of /proc/meminfo, in bytes."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise Failure("/proc/meminfo has no MemAvailable line")


def spare_from_oom_killer() -> bool:
    try:
        Path("/proc/self/oom_score_adj").write_text("-1000")
        return True
    except OSError:
        return False


def hold(n_bytes: int) -> tuple[mmap.mmap, bool]:
    """n_bytes of anonymous memory, every page written (resident), locked where allowed."""
    import numpy as np

    buf = mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = np.frombuffer(buf, dtype=np.uint8)
    step = 1 << 28  # touch in 256 MiB pieces: a kernel that cannot give more stops us early
    for start in range(0, n_bytes, step):
        view[start:min(n_bytes, start + step):PAGE] = 1
    del view
    locked = False
    try:  # root may raise its own limit; others keep theirs
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY or soft >= n_bytes:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            first = ctypes.c_char.from_buffer(buf)
            locked = libc.mlock(ctypes.c_void_p(ctypes.addressof(first)),
                                ctypes.c_size_t(n_bytes)) == 0
            del first
        except (OSError, AttributeError, TypeError):
            locked = False
    return buf, locked


def evict(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise Failure(f"--evict {path}: {e.strerror}") from None
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def gguf_sizes(path: Path) -> dict[str, float]:
    """{'always': GB, 'rows': GB, 'total': GB} of a GGUF file's tensors (see the module doc)."""
    try:
        import gguf
    except ImportError:
        raise Failure("the Python package `gguf` is missing: run with .venv/bin/python") from None
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as e:
        raise Failure(f"cannot read {path} as a GGUF file: {e}") from None
    arch = reader.get_field("general.architecture")
    spark = arch is not None and arch.contents() == "spark-gemma2"
    always = rows = 0
    for t in reader.tensors:
        n = int(t.n_bytes)
        if spark and t.name.endswith((".ffn_up.weight", ".ffn_down_t.weight", ".ffn_k2v.weight")):
            rows += n
        else:
            always += n
    return {"always": always / GB, "rows": rows / GB, "total": (always + rows) / GB}


def main(argv: list[str]) -> int:
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1:]
    else:
        cmd = []
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--leave", type=float, help="GB of memory to leave to CMD")
    ap.add_argument("--evict", type=Path, action="append", default=[],
                    help="drop this file's pages from the page cache first (repeatable)")
    ap.add_argument("--sizes", type=Path, help="print a GGUF file's always-read and row bytes")
    ap.add_argument("--quiet", action="store_true", help="no progress on stderr")
    a = ap.parse_args(argv)
    say = (lambda *_: None) if a.quiet else (lambda m: print(f"{PROG}: {m}", file=sys.stderr,
                                                              flush=True))
    try:
        if a.sizes is not None:
            if a.leave is not None or cmd:
                ap.error("--sizes takes no --leave and no command")
            for k, v in gguf_sizes(a.sizes).items():
                print(f"{k} {v:.6f}")
            return 0
        if a.leave is None and not cmd and a.evict:
            for f in a.evict:
                evict(f)
            return 0
        if a.leave is None or not cmd:
            ap.error("--leave GB and a command after -- are needed")
        if a.leave <= 0:
            ap.error(f"--leave {a.leave}: must be more than 0 GB")
        import shutil
        if shutil.which(cmd[0]) is None:
            raise Failure(f"cannot run {cmd[0]}: not found or not executable")
        avail = mem_available()
        take = avail - int(a.leave * GB)
        if take < 0:
            raise Failure(f"--leave {a.leave:g} GB: only {avail / GB:.2f} GB is available")
        spared = spare_from_oom_killer()
        held, locked = (hold(take) if take >= PAGE else (None, False))
        for f in a.evict:
            evict(f)
        say(f"holding {take / GB:.2f} GB ({'locked' if locked else 'not locked'}"
            f"{', spared by the OOM killer' if spared else ''}); MemAvailable now "
            f"{mem_available() / GB:.2f} GB for: {' '.join(cmd)}")
        try:
            rc = subprocess.run(cmd).returncode
        except OSError as e:
            raise Failure(f"cannot run {cmd[0]}: {e.strerror}") from None
        finally:
            if held is not None:
                held.close()
        if rc < 0:
            say(f"{cmd[0]} was killed by signal {-rc} (out of memory within the budget?)")
            return 128 - rc
        return rc
    except Failure as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except MemoryError:
        print(f"{PROG}: error: the kernel refused the memory to hold", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
