"""A small client of ggml's RPC protocol, for tests that speak to an `rpc-server` directly
(test_rpc_fuzz.py): hello, buffers, tensor data, graphs with named custom ops, and raw bytes.

The wire format is the one of the patched tree's ggml/src/ggml-rpc/ggml-rpc.cpp (protocol 7.2;
`bash tools/llama-tree.sh DIR` writes that tree), written here from its definitions:

- a request is `| command (1 byte) | size (u64) | payload (size bytes) |` (`send_rpc_cmd`), and
  a reply, for the commands that have one, `| size (u64) | payload |` (`send_msg`); everything
  is little-endian and the structs are packed (`#pragma pack(push, 1)`);
- the first command of a connection is HELLO with a `rpc_msg_hello_req` (RPC_CONN_CAPS_SIZE =
  24 bytes of transport capabilities; zeros: plain TCP), answered by major, minor, patch, one
  padding byte and the server's capabilities (`rpc_serve_client`);
- a tensor travels as `struct rpc_tensor` (296 bytes: id, type, remote buffer, ne[4] and nb[4]
  as u32, op, op_params[16], flags, src[10], view_src, view_offs, data address, name[64],
  use_count);
- GRAPH_COMPUTE's payload is `| device (u32) | n_nodes (u32) | node ids (n_nodes x u64) |
  n_tensors (u32) | rpc_tensor x n_tensors |` (`serialize_graph`) and has no reply: the server
  computes the graph before it reads the next command, so a GET_TENSOR after it returns the
  result, and a refused graph closes the connection (`rpc_server::graph_compute` returns false);
- a GGML_OP_CUSTOM node carries, in place of its function pointer (op_params bytes 0-7), the
  64-bit FNV-1a hash of the name the op was registered under (`rpc_custom_op_id`, patch 0009);
  the server looks the hash up in its own table, and a node whose hash it does not know fails
  the graph.

The enum values of ggml (types, ops, GGML_MAX_*) are read from the installed header
(`target/upstream/include/ggml.h`, `ggml_header_constants`), so they follow the build; the RPC
command numbers and struct layouts are not in an installed header and are written below."""

from __future__ import annotations

import re
import socket
import struct
from dataclasses import dataclass, field
from pathlib import Path

# enum rpc_cmd (ggml-rpc.cpp); RPC_CMD_HELLO is pinned at 14 there.
ALLOC_BUFFER = 0
GET_ALIGNMENT = 1
GET_MAX_SIZE = 2
BUFFER_GET_BASE = 3
FREE_BUFFER = 4
BUFFER_CLEAR = 5
SET_TENSOR = 6
SET_TENSOR_HASH = 7
GET_TENSOR = 8
COPY_TENSOR = 9
GRAPH_COMPUTE = 10
GET_DEVICE_MEMORY = 11
INIT_TENSOR = 12
GET_ALLOC_SIZE = 13
HELLO = 14
DEVICE_COUNT = 15
GRAPH_RECOMPUTE = 16
MEMSET_TENSOR = 17
CUSTOM_OP_SUPPORTED = 18
GET_EXTRA_BUFTS = 19
ALLOC_EXTRA_BUFFER = 20
GET_EXTRA_ALLOC_SIZE = 21
EXTRA_SUPPORTS_OP = 22
CMD_COUNT = 24  # RPC_CMD_NONE = 23, then RPC_CMD_COUNT

COMMANDS = {v: k for k, v in dict(globals()).items()
            if isinstance(v, int) and k.isupper() and k not in ("CMD_COUNT",)}
COMMANDS[23] = "NONE"  # RPC_CMD_NONE: the client's placeholder, never sent
COMMANDS[24] = "COUNT"  # RPC_CMD_COUNT: no command

# the extra buffer types a reply lists at most (RPC_MAX_EXTRA_BUFTS, patch 0013)
MAX_EXTRA_BUFTS = 8

PROTO_MAJOR = 7
CONN_CAPS_SIZE = 24

# struct rpc_tensor, packed: id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10],
# view_src, view_offs, data, name[64], use_count
RPC_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")
assert RPC_TENSOR.size == 296

# ggml's tensor flags (enum ggml_tensor_flag): the CPU backend computes only nodes flagged
# COMPUTE (ggml_graph_compute_thread), as the scheduler marks them.
FLAG_COMPUTE = 16

# ggml_custom_op_params (ggml-impl.h): fun (8 bytes), n_tasks (int, then 4 bytes of padding),
# userdata (8 bytes); GGML_N_TASKS_MAX = -1.
N_TASKS_MAX = -1

# Element size and block of the types these tests build tensors of (ggml.c, type_traits).
TYPE_SIZE = {"F32": (4, 1), "F16": (2, 1), "BF16": (2, 1), "I8": (1, 1), "I32": (4, 1),
             "Q8_0": (34, 32), "Q4_0": (18, 32), "Q4_K": (144, 256), "MXFP4": (17, 32),
             "IQ2_XXS": (66, 256)}


class Closed(Exception):
    """The server closed the connection (or it broke) before the whole reply came."""


def fnv1a64_bytes(data: bytes) -> int:
    """64-bit FNV-1a (ggml-rpc's fnv_hash: the name a cached SET_TENSOR is saved under)."""
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return h


def fnv1a64(name: str) -> int:
    """The id a named custom op travels under (`rpc_custom_op_id`)."""
    return fnv1a64_bytes(name.encode())


def ggml_header_constants(header: Path) -> tuple[dict, dict, dict]:
    """(types, ops, limits) from ggml.h: {"F32": 0, ...}, {"CUSTOM": n, ...} and the
    GGML_MAX_* defines that size `rpc_tensor`."""
    text = header.read_text()

    def enum_body(name: str) -> str:
        m = re.search(r"enum\s+" + name + r"\s*\{(.*?)\};", text, re.S)
        assert m, f"{header}: no enum {name}"
        return re.sub(r"//[^\n]*|/\*.*?\*/", "", m.group(1), flags=re.S)

    def values(body: str, prefix: str) -> dict:
        out, nxt = {}, 0
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            m = re.fullmatch(prefix + r"(\w+)(?:\s*=\s*(\d+))?", item)
            assert m, f"{header}: cannot read enum item {item!r}"
            nxt = int(m.group(2)) if m.group(2) else nxt
            out[m.group(1)] = nxt
            nxt += 1
        return out

    types = values(enum_body("ggml_type"), "GGML_TYPE_")
    ops = values(enum_body("ggml_op"), "GGML_OP_")
    limits = {k: int(v) for k, v in re.findall(r"#\s*define\s+(GGML_MAX_\w+)\s+(\d+)\b", text)}
    return types, ops, limits


@dataclass(eq=False)
class Tensor:
    """A tensor as the client describes it to the server. `data` is an address in the
    server's buffer `buffer` (both 0: no data); sources are other Tensors (or raw ids)."""
    type: int
    ne: tuple
    nb: tuple
    buffer: int = 0
    data: int = 0
    op: int = 0
    op_params: bytes = b""
    flags: int = 0
    src: list = field(default_factory=list)
    view_src: object = None
    view_offs: int = 0
    name: str = ""
    id: int = 0  # 0: assigned when the graph is serialized

    def pack(self) -> bytes:
        srcs = [s if isinstance(s, int) else s.id for s in self.src]
        srcs += [0] * (10 - len(srcs))
        vs = self.view_src if isinstance(self.view_src, int) or self.view_src is None \
            else self.view_src.id
        params = struct.unpack("<16i", self.op_params.ljust(64, b"\0")[:64])
        # ne and nb travel as u32: a larger value is cut as serialize_tensor's assignment cuts it
        ne = [x & 0xFFFFFFFF for x in self.ne]
        nb = [x & 0xFFFFFFFF for x in self.nb]
        return RPC_TENSOR.pack(self.id, self.type, self.buffer, *ne, *nb, self.op,
                               *params, self.flags, *srcs, vs or 0, self.view_offs, self.data,
                               self.name.encode()[:63], 0)


def contiguous_nb(elem: int, block: int, ne: tuple) -> tuple:
    """ggml's strides of a contiguous tensor of `ne` (ggml_new_tensor_impl)."""
    nb = [elem, elem * (ne[0] // block)]
    nb.append(nb[1] * ne[1])
    nb.append(nb[2] * ne[2])
    return tuple(nb)


# struct spark_op_params (layer, k, r, softcap, ffn_cutoff, ffn_z) and spark_rope's view of the
# same 24 bytes, struct spark_rope_params (layer, r, freq_base, freq_scale, scale, reserved)
OP_PARAMS_FORMAT = "<iiifif"
ROPE_PARAMS_FORMAT = "<iifffi"


def custom_op_params(op_id: int, spark: tuple | None = None, n_tasks: int = N_TASKS_MAX,
                     magic: bytes = b"SPK1", call_state: bytes = bytes(8),
                     fmt: str = OP_PARAMS_FORMAT) -> bytes:
    """The op_params of a GGML_OP_CUSTOM node as ggml-rpc sends it: the op's id in place of the
    function pointer, n_tasks, userdata 0; then, for a Spark node, the call state (bytes 24-31,
    zero at rest), `magic` and the parameter block packed as `fmt`: struct spark_op_params
    (layer, k, r, softcap[, ffn_cutoff, ffn_z]; the last two 0 when left out), or spark_rope's
    six fields with ROPE_PARAMS_FORMAT (docs/INTERFACES.md, "Parameters in the node")."""
    head = struct.pack("<QiiQ", op_id, n_tasks, 0, 0)
    if spark is None:
        return head
    fields = (tuple(spark) + (0, 0.0))[:6]
    return head + call_state + magic + struct.pack(fmt, *fields)


class Client:
    """One connection to an rpc-server, after HELLO (`connect`)."""

    def __init__(self, endpoint: str, timeout: float = 30.0):
        host, port = endpoint.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = None

    @classmethod
    def connect(cls, endpoint: str, timeout: float = 30.0) -> "Client":
        c = cls(endpoint, timeout)
        reply = c.call(HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
        c.version = tuple(reply[:3])
        if c.version[0] != PROTO_MAJOR:
            raise RuntimeError(f"RPC server speaks protocol {c.version}, want {PROTO_MAJOR}.x")
        return c

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- framing

    def send_raw(self, data: bytes):
        try:
            self.sock.sendall(data)
        except socket.timeout:
            raise
        except OSError as e:
            raise Closed(f"send failed: {e!r}") from e

    def send(self, cmd: int, payload: bytes):
        self.send_raw(struct.pack("<BQ", cmd, len(payload)) + payload)

    def recv_exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            try:
                chunk = self.sock.recv(n - len(buf))
            except socket.timeout:
                raise
            except OSError as e:
                raise Closed(f"recv failed after {len(buf)} of {n} bytes: {e!r}") from e
            if not chunk:
                raise Closed(f"connection closed after {len(buf)} of {n} bytes")
            buf += chunk
        return bytes(buf)

    def reply(self, size: int | None = None) -> bytes:
        (n,) = struct.unpack("<Q", self.recv_exact(8))
        if size is not None and n != size:
            raise RuntimeError(f"reply of {n} bytes, want {size}")
        return self.recv_exact(n)

    def call(self, cmd: int, payload: bytes, size: int | None = None) -> bytes:
        self.send(cmd, payload)
        return self.reply(size)

    def closed_by_server(self, timeout: float = 10.0) -> bool:
        """True when the server closes the connection within `timeout` s (reads nothing)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except socket.timeout:
            return False
        except OSError:
            return True

    # -- commands

    def device_count(self) -> int:
        return struct.unpack("<I", self.call(DEVICE_COUNT, b"", 4))[0]

    def alignment(self, device: int = 0) -> int:
        return struct.unpack("<Q", self.call(GET_ALIGNMENT, struct.pack("<I", device), 8))[0]

    def alloc_buffer(self, size: int, device: int = 0) -> tuple[int, int]:
        """(remote buffer, its size); (0, 0) when the server could not allocate it."""
        return struct.unpack("<QQ", self.call(ALLOC_BUFFER, struct.pack("<IQ", device, size), 16))

    def buffer_base(self, remote: int) -> int:
        return struct.unpack("<Q", self.call(BUFFER_GET_BASE, struct.pack("<Q", remote), 8))[0]

    def free_buffer(self, remote: int):
        self.send(FREE_BUFFER, struct.pack("<Q", remote))

    def set_tensor(self, t: Tensor, data: bytes, offset: int = 0):
        self.send(SET_TENSOR, t.pack() + struct.pack("<BQ", 0, offset) + data)

    def get_tensor(self, t: Tensor, size: int, offset: int = 0) -> bytes:
        return self.call(GET_TENSOR, t.pack() + struct.pack("<QQ", offset, size), size)

    def custom_op_supported(self, name: str) -> bool:
        return self.call(CUSTOM_OP_SUPPORTED, struct.pack("<Q", fnv1a64(name)), 1) != b"\0"

    def buffer_clear(self, remote: int, value: int):
        """Every byte of the buffer set to `value` (no reply)."""
        self.send(BUFFER_CLEAR, struct.pack("<QB", remote, value))

    def memset_tensor(self, t: Tensor, offset: int, size: int, value: int):
        self.send(MEMSET_TENSOR, t.pack() + struct.pack("<QQB", offset, size, value))

    def set_tensor_cached(self, t: Tensor, data: bytes, offset: int = 0):
        """SET_TENSOR with the cache flag: a server started with --cache also saves the data
        under its FNV-1a hash, which SET_TENSOR_HASH then names."""
        self.send(SET_TENSOR, t.pack() + struct.pack("<BQ", 1, offset) + data)

    def set_tensor_hash(self, t: Tensor, offset: int, digest: int) -> bool:
        """True when the server had the data of that hash and wrote it."""
        return self.call(SET_TENSOR_HASH, t.pack() + struct.pack("<QQ", offset, digest), 1) \
            != b"\0"

    def copy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return self.call(COPY_TENSOR, src.pack() + dst.pack(), 1) != b"\0"

    def init_tensor(self, t: Tensor):
        self.send(INIT_TENSOR, t.pack())

    def get_alloc_size(self, t: Tensor, srcs: tuple = (), device: int = 0) -> int:
        return struct.unpack("<Q", self.call(GET_ALLOC_SIZE, struct.pack("<I", device) + t.pack()
                                             + pack_srcs(srcs), 8))[0]

    def device_memory(self, device: int = 0) -> tuple[int, int]:
        return struct.unpack("<QQ", self.call(GET_DEVICE_MEMORY, struct.pack("<I", device), 16))

    def graph_recompute(self, device: int = 0):
        self.send(GRAPH_RECOMPUTE, struct.pack("<I", device))

    # patch 0013's commands (protocol 7.2): the server's extra (repacked) buffer types

    def extra_bufts(self, device: int = 0) -> list[tuple[str, int, int]]:
        """(name, alignment, max size) of each extra buffer type, numbered from 1 in order."""
        reply = self.call(GET_EXTRA_BUFTS, struct.pack("<I", device), 4 + MAX_EXTRA_BUFTS * 80)
        (count,) = struct.unpack_from("<I", reply)
        out = []
        for i in range(min(count, MAX_EXTRA_BUFTS)):
            name, align, max_size = struct.unpack_from("<64sQQ", reply, 4 + 80 * i)
            out.append((name.split(b"\0")[0].decode(), align, max_size))
        return out

    def alloc_extra_buffer(self, size: int, extra: int, device: int = 0) -> tuple[int, int]:
        return struct.unpack("<QQ", self.call(ALLOC_EXTRA_BUFFER,
                                              struct.pack("<IIQ", device, extra, size), 16))

    def get_extra_alloc_size(self, t: Tensor, extra: int, device: int = 0) -> int:
        return struct.unpack("<Q", self.call(GET_EXTRA_ALLOC_SIZE,
                                             struct.pack("<II", device, extra) + t.pack(), 8))[0]

    def extra_supports_op(self, op: Tensor, srcs: tuple = (), src_extra: tuple = (),
                          device: int = 0) -> bool:
        """Whether the server runs `op` with sources `srcs`, source i kept in extra buffer type
        src_extra[i] (0: none; a source without a buffer stands for an empty one of that type,
        as llama.cpp asks when it places a weight)."""
        extra = list(src_extra) + [0] * (10 - len(src_extra))
        payload = struct.pack("<I10I", device, *extra) + op.pack() + pack_srcs(srcs)
        return self.call(EXTRA_SUPPORTS_OP, payload, 1) != b"\0"

    def graph_compute(self, nodes: list, device: int = 0, extra: list = ()):
        """Sends the graph of `nodes` (in order), with every tensor they reach through their
        sources and view sources (and `extra` ones) in the tensor list, as serialize_graph
        does. Ids are assigned to tensors that have none."""
        self.send(GRAPH_COMPUTE, graph_payload(nodes, device, extra))


def pack_srcs(srcs: tuple) -> bytes:
    """GGML_MAX_SRC (10) rpc_tensors: the given ones (None: an all-zero tensor, id 0, which the
    server leaves out), then zeros; ids are assigned to tensors that have none."""
    out = []
    for i, t in enumerate(list(srcs) + [None] * (10 - len(srcs))):
        if t is None:
            out.append(bytes(RPC_TENSOR.size))
            continue
        if t.id == 0:
            t.id = 0x900 + i
        out.append(t.pack())
    return b"".join(out)


def graph_payload(nodes: list, device: int = 0, extra: list = ()) -> bytes:
    """GRAPH_COMPUTE's payload for `nodes` (module docs)."""
    tensors, seen = [], set()
    # sources before the tensors that use them (post-order), without recursion: a graph may be
    # a chain far deeper than Python's stack
    stack = [(t, False) for t in reversed([*nodes, *extra])]
    while stack:
        t, expanded = stack.pop()
        if t is None or isinstance(t, int):
            continue
        if expanded:
            tensors.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        stack += [(s, False) for s in reversed([*t.src, t.view_src])]
    next_id = 1 + max([t.id for t in tensors] + [0x1000])
    for t in tensors:
        if t.id == 0:
            t.id = next_id
            next_id += 1
    out = struct.pack("<II", device, len(nodes))
    out += b"".join(struct.pack("<Q", n if isinstance(n, int) else n.id) for n in nodes)
    out += struct.pack("<I", len(tensors)) + b"".join(t.pack() for t in tensors)
    return out


class Arena:
    """One server buffer, cut into tensors from its base at the server's alignment; `extra` > 0:
    a buffer of the server's extra buffer type number `extra` (patch 0013)."""

    def __init__(self, client: Client, size: int, types: dict, extra: int = 0):
        self.client = client
        self.types = types
        self.align = client.alignment()
        self.remote, self.size = client.alloc_extra_buffer(size, extra) if extra \
            else client.alloc_buffer(size)
        if not self.remote:
            raise RuntimeError(f"the server did not allocate a buffer of {size} bytes")
        self.base = client.buffer_base(self.remote)
        self.used = 0

    def tensor(self, type_name: str, ne: tuple, nb: tuple | None = None, data: bytes | None = None,
               name: str = "", nbytes: int | None = None) -> Tensor:
        """A tensor of `ne` (padded with 1s to 4 dims) at the next aligned offset, with ggml's
        contiguous strides unless `nb` is given, and `data` written when given. Space: `nbytes`,
        or the size of `data`, or the contiguous size."""
        ne = tuple(ne) + (1,) * (4 - len(ne))
        elem, block = TYPE_SIZE[type_name]
        nb = tuple(nb) if nb is not None else contiguous_nb(elem, block, ne)
        if nbytes is None:
            nbytes = len(data) if data is not None else nb[3] * ne[3]
        off = -(-self.used // self.align) * self.align
        if off + nbytes > self.size:
            raise RuntimeError(f"arena of {self.size} bytes full")
        self.used = off + nbytes
        t = Tensor(self.types[type_name], ne, nb, buffer=self.remote, data=self.base + off,
                   name=name)
        if data is not None:
            self.client.set_tensor(t, data)
        return t
