#!/usr/bin/env python3
"""Run a command under streamd.service's system-call filter, without systemd, and watch its device nodes.

    tools/seccomp_run.py [--errno] [--check-devices] [--duration S] [--report FILE] -- COMMAND [ARG...]
    tools/seccomp_run.py --write-allow    regenerate systemd/syscalls.allow (needs systemd-analyze)
    tools/seccomp_run.py --check-allow    exit 1 when systemd/syscalls.allow no longer matches the unit

For boxes without systemd (the GPU box). The allow list is systemd/syscalls.allow, which --write-allow makes,
on a box with systemd, from the unit's SystemCallFilter= lines and the sets `systemd-analyze syscall-filter`
prints (in order: an allow list starts from @default, `~` entries remove, later plain entries add back). The
unit's RestrictAddressFamilies= is applied too: socket() of another family is treated as a call off the
list. The filter is loaded with libseccomp (libseccomp.so.2, through ctypes) in the child just before it
execs COMMAND, so every process COMMAND starts inherits it; NO_NEW_PRIVS is set, as NoNewPrivileges=yes.

  (default)  strict: a call off the list kills the process (SIGSYS). A run that completes with all its output
             made no call outside the list. Killed processes are named from the kernel's audit records when
             /dev/kmsg is readable.
  --errno    like the unit (SystemCallErrorNumber=EPERM): a call off the list fails with EPERM, and each one
             is named and counted (every filtered call comes to this tool as a seccomp user notification,
             answered with EPERM; the kernel itself does not log EPERM-filtered calls).
  --check-devices  while COMMAND runs, scan /proc/PID/fd and /proc/PID/maps of it and all its descendants for
             device nodes, and report those the unit's DeviceAllow= (plus DevicePolicy=closed's pseudo
             devices) would not let through.

Exit status: COMMAND's (128 + N when signal N ended it: 159 = SIGSYS), or 1 when COMMAND exited 0 but a call
was denied or a device is not allowed; 2 when the filter cannot be set up.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import fnmatch
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "streamd.service"
ALLOW = ROOT / "systemd" / "syscalls.allow"

# libseccomp (seccomp.h)
ACT_KILL_PROCESS = 0x80000000
ACT_ALLOW = 0x7FFF0000
ACT_NOTIFY = 0x7FC00000
CMP_EQ = 4
ARCH_NATIVE = 0

# DevicePolicy=closed lets these through besides DeviceAllow= (systemd's cgroup device setup).
CLOSED_POLICY = [
    *(f"/dev/{name} rwm" for name in ("null", "zero", "full", "random", "urandom", "tty", "ptmx")),
    "char-pts rw",
]


class SetupError(Exception):
    """The filter cannot be set up as asked (one line, exit 2)."""


def say(message: str) -> None:
    print(f"seccomp_run: {message}", file=sys.stderr, flush=True)


# -- the unit and the allow list ---------------------------------------------------------------------------


def unit_values(unit: Path, key: str) -> list[str]:
    """The values of ``key`` in the unit's [Service] section, in order."""
    values, section = [], ""
    for raw in unit.read_text().splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = line
        elif section == "[Service]" and line.startswith(f"{key}="):
            values.append(line.split("=", 1)[1].strip())
    return values


def systemd_sets() -> tuple[dict[str, list[str]], str]:
    """Every @set that systemd-analyze knows with its entries (names and nested @sets); systemd's version."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        raise SetupError("systemd-analyze not found: --write-allow and --check-allow need a box with systemd")
    out = subprocess.run(
        [analyze, "syscall-filter", "--no-pager"], capture_output=True, text=True, check=True
    )
    sets: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in out.stdout.splitlines():
        if line.startswith("@"):
            current = sets.setdefault(line.strip(), [])
        elif not line.strip():
            current = None
        elif current is not None and not line.strip().startswith("#"):
            current.append(line.strip())
    version = subprocess.run([analyze, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    return sets, version


def expand(name: str, sets: dict[str, list[str]]) -> set[str]:
    if not name.startswith("@"):
        return {name}
    if name not in sets:
        raise SetupError(f"systemd-analyze does not know the set {name}")
    return set().union(*(expand(entry, sets) for entry in sets[name]))


def effective_allow(filters: list[str], sets: dict[str, list[str]]) -> list[str]:
    """What systemd allows for these SystemCallFilter= values (``name:errno`` suffixes dropped)."""
    if not filters or filters[0].startswith("~"):
        raise SetupError("the unit's first SystemCallFilter= must be an allow list (the only kind mirrored)")
    allowed = expand("@default", sets)  # systemd adds @default to every allow list
    for value in filters:
        deny = value.startswith("~")
        for token in value.lstrip("~").split():
            names = expand(token.split(":", 1)[0], sets)
            allowed = allowed - names if deny else allowed | names
    return sorted(allowed)


def render_allow(unit: Path) -> str:
    sets, version = systemd_sets()
    filters = unit_values(unit, "SystemCallFilter")
    header = [
        f"# The system calls {unit.name} allows: its SystemCallFilter= lines below, resolved with the sets",
        f"# `systemd-analyze syscall-filter` of {version} prints. Made by",
        "# `tools/seccomp_run.py --write-allow`; do not edit. tools/seccomp_run.py applies it where there is",
        "# no systemd and refuses it when these lines differ from the unit's.",
    ]
    body = [f"# SystemCallFilter={value}" for value in filters] + effective_allow(filters, sets)
    return "\n".join(header + body) + "\n"


def read_allow(path: Path) -> tuple[list[str], list[str]]:
    """(the SystemCallFilter= values it was made from, the system call names)."""
    filters, names = [], []
    for line in path.read_text().splitlines():
        if line.startswith("# SystemCallFilter="):
            filters.append(line.split("=", 1)[1])
        elif line.strip() and not line.startswith("#"):
            names.append(line.strip())
    return filters, names


def address_families(unit: Path) -> list[int] | None:
    """The unit's RestrictAddressFamilies= as numbers; None when it does not restrict them."""
    tokens = " ".join(unit_values(unit, "RestrictAddressFamilies")).split()
    if not tokens:
        return None
    if tokens[0].startswith("~"):
        raise SetupError("RestrictAddressFamilies=~... (a deny list) is not mirrored by this tool")
    unknown = [t for t in tokens if not isinstance(getattr(socket, t, None), int)]
    if unknown:
        raise SetupError(f"address families this Python does not know: {unknown}")
    return sorted({int(getattr(socket, t)) for t in tokens})


# -- libseccomp --------------------------------------------------------------------------------------------


class ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]


class SeccompData(ctypes.Structure):
    _fields_ = [("nr", ctypes.c_int), ("arch", ctypes.c_uint32), ("ip", ctypes.c_uint64)]
    _fields_ += [("args", ctypes.c_uint64 * 6)]


class Notif(ctypes.Structure):  # struct seccomp_notif
    _fields_ = [("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32)]
    _fields_ += [("data", SeccompData)]


class NotifResp(ctypes.Structure):  # struct seccomp_notif_resp
    _fields_ = [("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32)]
    _fields_ += [("flags", ctypes.c_uint32)]


def load_libseccomp() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libseccomp.so.2")
    except OSError as exc:
        raise SetupError(
            f"libseccomp.so.2 cannot be loaded ({exc}); install it: apt install libseccomp2 (Debian, Ubuntu) "
            "or dnf install libseccomp (Fedora, RHEL)"
        ) from None
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_syscall_resolve_num_arch.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_num_arch.argtypes = [ctypes.c_uint32, ctypes.c_int]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_rule_add_array.argtypes += [ctypes.POINTER(ArgCmp)]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    if hasattr(lib, "seccomp_notify_fd"):  # libseccomp >= 2.5
        lib.seccomp_notify_fd.argtypes = [ctypes.c_void_p]
        notif, resp = ctypes.POINTER(Notif), ctypes.POINTER(NotifResp)
        lib.seccomp_notify_alloc.argtypes = [ctypes.POINTER(notif), ctypes.POINTER(resp)]
        lib.seccomp_notify_receive.argtypes = [ctypes.c_int, notif]
        lib.seccomp_notify_respond.argtypes = [ctypes.c_int, resp]
        lib.seccomp_notify_free.argtypes = [notif, resp]
    return lib


def notify_supported(lib: ctypes.CDLL) -> bool:
    """libseccomp >= 2.5 on a kernel with seccomp user notification (libseccomp API level >= 5)."""
    if not hasattr(lib, "seccomp_notify_receive") or not hasattr(lib, "seccomp_api_get"):
        return False
    lib.seccomp_api_get.restype = ctypes.c_uint
    return int(lib.seccomp_api_get()) >= 5


def syscall_name(lib: ctypes.CDLL, number: int) -> str:
    raw = lib.seccomp_syscall_resolve_num_arch(ARCH_NATIVE, number)
    if not raw:
        return f"syscall {number}"
    name = ctypes.string_at(raw).decode()
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(raw)
    return name


@dataclass
class Filter:
    names: list[str]  # allowed system calls
    families: list[int] | None  # socket() families allowed; None = any
    notify: bool  # calls off the list go to this tool (answered EPERM) instead of killing the process
    unknown: list[str] = field(default_factory=list)  # names not on this architecture / unknown to libseccomp

    def load(self, lib: ctypes.CDLL) -> int | None:
        """Load the filter into the calling process; the notification fd when ``notify``."""
        ctx = lib.seccomp_init(ACT_NOTIFY if self.notify else ACT_KILL_PROCESS)
        if not ctx:
            raise SetupError("seccomp_init failed")
        socket_nr = lib.seccomp_syscall_resolve_name(b"socket")
        for name in self.names:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue
            conditions: list[ArgCmp | None] = [None]  # unconditional
            if nr == socket_nr and self.families is not None:  # socket(family, ...): first argument
                conditions = [ArgCmp(0, CMP_EQ, family, 0) for family in self.families]
            for cmp in conditions:
                args = (1, ctypes.byref(cmp)) if cmp is not None else (0, None)
                rc = lib.seccomp_rule_add_array(ctx, ACT_ALLOW, nr, *args)
                if rc < 0:
                    raise SetupError(f"seccomp rule for {name} failed: {os.strerror(-rc)}")
        rc = lib.seccomp_load(ctx)
        if rc < 0:
            raise SetupError(f"seccomp_load failed: {os.strerror(-rc)}")
        fd = lib.seccomp_notify_fd(ctx) if self.notify else None
        lib.seccomp_release(ctx)
        return fd


def build_filter(unit: Path, allow_file: Path, notify: bool, lib: ctypes.CDLL) -> Filter:
    if not allow_file.exists():
        raise SetupError(f"{allow_file} not found (make it with --write-allow on a box with systemd)")
    made_from, names = read_allow(allow_file)
    if made_from != unit_values(unit, "SystemCallFilter"):
        raise SetupError(
            f"{allow_file} was made from other SystemCallFilter= lines than {unit} has; "
            "run tools/seccomp_run.py --write-allow on a box with systemd"
        )
    if notify and not notify_supported(lib):
        raise SetupError("--errno needs seccomp user notification (libseccomp >= 2.5, Linux >= 5.5)")
    unknown = [n for n in names if lib.seccomp_syscall_resolve_name(n.encode()) < 0]
    return Filter(names, address_families(unit), notify, unknown)


# -- devices -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceRule:
    source: str  # the unit line that allows it
    kind: str  # "c" or "b"
    major: int
    minor: int | None  # None: every minor of the major
    access: str  # letters of "rwm"


@dataclass
class DeviceUse:
    path: str
    kind: str
    major: int
    minor: int
    access: set[str] = field(default_factory=set)
    processes: set[str] = field(default_factory=set)


def device_kind(st: os.stat_result) -> str | None:
    return "c" if stat.S_ISCHR(st.st_mode) else "b" if stat.S_ISBLK(st.st_mode) else None


def device_rules(unit: Path) -> tuple[list[DeviceRule], list[str]]:
    """The unit's device allow list as device numbers on this box, and notes on entries matching nothing."""
    policy = (unit_values(unit, "DevicePolicy") or ["auto"])[-1]
    entries = [(value, f"DeviceAllow={value}") for value in unit_values(unit, "DeviceAllow")]
    if policy in ("closed", "strict"):
        entries += [(value, f"DevicePolicy={policy}") for value in CLOSED_POLICY]
    if (unit_values(unit, "ProtectClock") or ["no"])[-1] in ("yes", "true", "1"):
        entries.append(("char-rtc r", "ProtectClock=yes"))
    majors: dict[str, list[tuple[int, str]]] = {"c": [], "b": []}
    kind = "c"
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith("devices:"):
            kind = "c" if line.startswith("Character") else "b"
        elif line.strip():
            number, name = line.split(None, 1)
            majors[kind].append((int(number), name.strip()))
    rules: list[DeviceRule] = []
    notes: list[str] = []
    for value, source in entries:
        spec, access = [*value.split(), "rwm"][:2]
        if spec.startswith(("char-", "block-")):
            kind, pattern = ("c" if spec.startswith("char-") else "b"), spec.split("-", 1)[1]
            found = [number for number, name in majors[kind] if fnmatch.fnmatchcase(name, pattern)]
            if not found:
                notes.append(f"{source}: no device named {pattern!r} in /proc/devices here")
            rules += [DeviceRule(source, kind, number, None, access) for number in found]
            continue
        try:
            st = os.stat(spec)
        except OSError:
            notes.append(f"{source}: {spec} does not exist here")
            continue
        kind_ = device_kind(st)
        if kind_ is not None:
            rules.append(DeviceRule(source, kind_, os.major(st.st_rdev), os.minor(st.st_rdev), access))
    return rules, notes


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
                children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def opened_devices(pid: int) -> list[tuple[str, os.stat_result, str]]:
    """(path, stat, access) of the device nodes ``pid`` has open or mapped."""
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError, ValueError):
                st = os.stat(f"/proc/{pid}/fd/{fd}")
                if device_kind(st) is None:
                    continue
                fdinfo = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
                flags = int(fdinfo.split("flags:", 1)[1].split()[0], 8)
                access = {os.O_RDONLY: "r", os.O_WRONLY: "w"}.get(flags & os.O_ACCMODE, "rw")
                found.append((os.readlink(f"/proc/{pid}/fd/{fd}"), st, access))
    with contextlib.suppress(OSError):
        lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        mapped = {p for p in (line.split(None, 5)[-1] for line in lines) if p.startswith("/dev/")}
        for path in mapped:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                if device_kind(st) is not None:
                    found.append((path, st, "r"))
    return found


def scan_devices(root: int, seen: dict[tuple[str, int, int], DeviceUse]) -> None:
    for pid in descendants(root):
        try:
            label = f"{Path(f'/proc/{pid}/comm').read_text().strip()}[{pid}]"
        except OSError:
            continue
        for path, st, access in opened_devices(pid):
            kind = device_kind(st) or "c"
            key = (path, os.major(st.st_rdev), os.minor(st.st_rdev))
            use = seen.setdefault(key, DeviceUse(path, kind, key[1], key[2]))
            use.access |= set(access)
            use.processes.add(label)


def covered_by(use: DeviceUse, rules: list[DeviceRule]) -> str | None:
    for rule in rules:
        same = (rule.kind, rule.major) == (use.kind, use.major) and rule.minor in (None, use.minor)
        if same and use.access <= set(rule.access):
            return rule.source
    return None


# -- running -----------------------------------------------------------------------------------------------


@dataclass
class RunResult:
    exit_code: int = 0
    signal: str | None = None
    seconds: float = 0.0
    denied: Counter[str] = field(default_factory=Counter)  # system call -> times denied
    denied_by: dict[str, set[str]] = field(default_factory=dict)  # system call -> "comm[pid]"
    killed: list[dict] = field(default_factory=list)  # {"pid", "comm", "syscall"} from the audit records
    killed_elsewhere: list[dict] = field(default_factory=list)  # records of pids not seen in COMMAND's tree
    pids: set[int] = field(default_factory=set)  # COMMAND and its descendants, as sampled
    devices: dict[tuple[str, int, int], DeviceUse] = field(default_factory=dict)


class Notifications:
    """Answers the child's filtered calls with EPERM, counting them by name (the --errno mode)."""

    def __init__(self, lib: ctypes.CDLL, fd: int) -> None:
        self.lib, self.fd = lib, fd
        self.req = ctypes.POINTER(Notif)()
        self.resp = ctypes.POINTER(NotifResp)()
        if lib.seccomp_notify_alloc(ctypes.byref(self.req), ctypes.byref(self.resp)) != 0:
            raise SetupError("seccomp_notify_alloc failed")

    def answer_one(self, result: RunResult) -> None:
        ctypes.memset(self.req, 0, ctypes.sizeof(Notif))  # the kernel wants a zeroed buffer
        if self.lib.seccomp_notify_receive(self.fd, self.req) != 0:
            return  # the caller died meanwhile
        call = self.req.contents
        name = syscall_name(self.lib, call.data.nr)
        try:
            comm = Path(f"/proc/{call.pid}/comm").read_text().strip()
        except OSError:
            comm = "?"
        result.denied[name] += 1
        result.denied_by.setdefault(name, set()).add(f"{comm}[{call.pid}]")
        ctypes.memset(self.resp, 0, ctypes.sizeof(NotifResp))
        self.resp.contents.id = call.id
        self.resp.contents.error = -errno.EPERM
        self.lib.seccomp_notify_respond(self.fd, self.resp)  # fails only if the caller died

    def close(self) -> None:
        self.lib.seccomp_notify_free(self.req, self.resp)
        os.close(self.fd)  # calls of processes COMMAND left behind now fail (ENOSYS) instead of waiting


def kmsg_open() -> int | None:
    with contextlib.suppress(OSError):
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        os.lseek(fd, 0, os.SEEK_END)
        return fd
    return None


def kmsg_killed(fd: int, lib: ctypes.CDLL) -> list[dict]:
    """The kernel's audit records (type=1326) of processes killed by seccomp (sig=31) since ``kmsg_open``."""
    killed = []
    while True:
        try:
            record = os.read(fd, 8192).decode(errors="replace")
        except BlockingIOError:
            break
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # the ring buffer overtook us: the next read resumes
                continue
            break
        if "type=1326" in record and " sig=31 " in record:
            fields = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', record))
            name = syscall_name(lib, int(fields.get("syscall", "-1")))
            killed.append(
                {"pid": int(fields.get("pid", 0)), "comm": fields.get("comm", "").strip('"'), "syscall": name}
            )
    return killed


def start_child(command: list[str], flt: Filter, lib: ctypes.CDLL) -> tuple[int, int | None]:
    """Fork; the child loads the filter and execs COMMAND in its own process group (a terminal's Ctrl-C
    reaches it once, forwarded by us). (pid, notification fd or None)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            os.setpgid(0, 0)
            fd = flt.load(lib)
            if fd is not None:
                socket.send_fds(theirs, [b"n"], [fd])
                os.close(fd)
            theirs.close()
            os.execvp(command[0], command)
        except BaseException as exc:
            os.write(2, f"seccomp_run: cannot start {command[0]}: {exc}\n".encode())
        os._exit(127)
    theirs.close()
    notify_fd = None
    if flt.notify:
        _, fds, _, _ = socket.recv_fds(ours, 1, 1)
        notify_fd = fds[0] if fds else None
    ours.close()
    return pid, notify_fd


def run(
    command: list[str], flt: Filter, lib: ctypes.CDLL, check_devices: bool, duration: float | None
) -> RunResult:
    kmsg = None if flt.notify else kmsg_open()
    start = time.monotonic()
    pid, notify_fd = start_child(command, flt, lib)
    if flt.notify and notify_fd is None:
        raise SetupError("the child could not load the filter (above)")

    def forward(signum: int, _frame: object = None) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, forward)
    result = RunResult()
    poller = select.poll()
    notes = None
    if notify_fd is not None:
        notes = Notifications(lib, notify_fd)
        poller.register(notify_fd, select.POLLIN)
    next_scan, term_at, kill_at = 0.0, (start + duration if duration else None), None
    result.pids.add(pid)
    while True:
        for _, event in poller.poll(200):
            if notes is not None and event & select.POLLIN:
                notes.answer_one(result)
        now = time.monotonic()
        if now >= next_scan:  # who belongs to COMMAND: audit records are matched against these pids
            result.pids.update(descendants(pid))
            if check_devices:
                scan_devices(pid, result.devices)
            next_scan = now + 0.5
        if term_at is not None and now >= term_at:
            forward(signal.SIGTERM)
            term_at, kill_at = None, now + 120
        if kill_at is not None and now >= kill_at:
            forward(signal.SIGKILL)
            kill_at = None
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
    result.seconds = time.monotonic() - start
    if notes is not None:
        notes.close()
    if os.WIFSIGNALED(status):
        result.signal = signal.Signals(os.WTERMSIG(status)).name
        result.exit_code = 128 + os.WTERMSIG(status)
    else:
        result.exit_code = os.WEXITSTATUS(status)
    if kmsg is not None:
        time.sleep(0.3)  # the audit record is written as the process dies
        for record in kmsg_killed(kmsg, lib):
            (result.killed if record["pid"] in result.pids else result.killed_elsewhere).append(record)
        os.close(kmsg)
    return result


# -- report ------------------------------------------------------------------------------------------------


def findings(result: RunResult, flt: Filter, rules: list[DeviceRule] | None) -> dict:
    """The run as JSON-able data (``devices`` is None when they were not checked)."""
    devices = None
    if rules is not None:
        devices = [
            {
                "path": u.path,
                "type": u.kind,
                "major": u.major,
                "minor": u.minor,
                "access": "".join(sorted(u.access)),
                "processes": sorted(u.processes),
                "covered_by": covered_by(u, rules),
            }
            for u in sorted(result.devices.values(), key=lambda u: u.path)
        ]
    denied = [
        {"syscall": name, "count": count, "processes": sorted(result.denied_by[name])}
        for name, count in result.denied.most_common()
    ]
    return {
        "mode": "errno" if flt.notify else "kill",
        "exit_code": result.exit_code,
        "signal": result.signal,
        "seconds": round(result.seconds, 1),
        "allowed_syscalls": len(flt.names) - len(flt.unknown),
        "unknown_here": flt.unknown,
        "denied": denied,
        "killed": result.killed,
        "killed_elsewhere": result.killed_elsewhere,
        "devices": devices,
    }


def tell(summary: dict, notes: list[str]) -> int:
    """Print the findings; return the number of problems (denied or killing calls, devices not allowed)."""
    problems = len(summary["killed"]) + len(summary["denied"])
    if summary["signal"] == "SIGSYS":
        named = summary["killed"] or summary["killed_elsewhere"]
        hint = "" if named else " (rerun with --errno to name it)"
        say(f"COMMAND was killed by SIGSYS: it made a system call outside the list{hint}")
    for k in summary["killed"]:
        say(f"killed: {k['comm']}[{k['pid']}] called {k['syscall']}")
    for k in summary["killed_elsewhere"]:  # e.g. COMMAND's process seen under another PID namespace's pid
        say(
            f"also killed by a seccomp filter meanwhile (maybe not COMMAND's): {k['comm']}[{k['pid']}] "
            f"called {k['syscall']}"
        )
    for d in summary["denied"]:
        say(f"denied (EPERM): {d['syscall']} x{d['count']} by {', '.join(d['processes'])}")
    for note in notes:
        say(f"note: {note}")
    for dev in summary["devices"] or []:
        where = f"{dev['path']} ({dev['type']} {dev['major']}:{dev['minor']}, {dev['access']})"
        verdict = f"allowed by {dev['covered_by']}" if dev["covered_by"] else "NOT ALLOWED by the unit"
        say(f"device {where}: {verdict}")
        problems += dev["covered_by"] is None
    ended = f" ({summary['signal']})" if summary["signal"] else ""
    say(f"exit {summary['exit_code']}{ended} after {summary['seconds']} s; {problems} problem(s)")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="seccomp_run.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--unit", type=Path, default=UNIT, help="the unit file (default: systemd/streamd.service)")
    p.add_argument("--allow-file", type=Path, default=ALLOW, help="default: systemd/syscalls.allow")
    p.add_argument(
        "--errno", action="store_true", help="a call off the list fails with EPERM and is reported"
    )
    p.add_argument("--check-devices", action="store_true", help="report devices DeviceAllow= does not cover")
    p.add_argument("--duration", type=float, help="send COMMAND SIGTERM after this many seconds")
    p.add_argument("--report", type=Path, help="also write the findings as JSON to this file")
    p.add_argument("--write-allow", action="store_true", help="regenerate --allow-file (needs systemd)")
    p.add_argument("--check-allow", action="store_true", help="exit 1 when --allow-file is out of date")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    args = p.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        if args.write_allow:
            args.allow_file.write_text(render_allow(args.unit))
            say(f"wrote {args.allow_file}")
            return 0
        if args.check_allow:
            if args.allow_file.exists() and args.allow_file.read_text() == render_allow(args.unit):
                say(f"{args.allow_file} matches {args.unit}")
                return 0
            say(f"{args.allow_file} does not match {args.unit}: run tools/seccomp_run.py --write-allow")
            return 1
        if not command:
            p.error("nothing to run: tools/seccomp_run.py [options] -- COMMAND [ARG...]")
        lib = load_libseccomp()
        flt = build_filter(args.unit, args.allow_file, args.errno, lib)
        rules, notes = device_rules(args.unit) if args.check_devices else (None, [])
        action = "EPERM (reported)" if flt.notify else "kill-process"
        allowed = len(flt.names) - len(flt.unknown)
        say(f"{allowed} system calls allowed, {action} for the others: {' '.join(command)}")
        result = run(command, flt, lib, args.check_devices, args.duration)
    except SetupError as exc:
        say(str(exc))
        return 2
    summary = findings(result, flt, rules)
    if args.report:
        args.report.write_text(json.dumps(summary, indent=1) + "\n")
    problems = tell(summary, notes)
    return 1 if result.exit_code == 0 and problems else result.exit_code


if __name__ == "__main__":
    sys.exit(main())
