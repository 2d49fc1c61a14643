"""What ``streamd check`` verifies beyond the config's own rules, as the user running it (the systemd unit
runs it as the service user, ExecStartPre): every file stream opens as video with the demux backend ``run``
uses, and every jsonl sink's file can be opened for append by this user.

A stream file is opened (the container's header, then its first video packet), bounded by the stream's
``open_timeout_s`` and ``read_timeout_s``; nothing is decoded. RTSP cameras are not contacted: one that is
down at boot must not keep the service from starting. A sink's existing file is opened for append and
closed, which changes nothing in it; a file that does not exist yet is not created: its folder must be
writable. Rotation (``rotate_bytes``/``rotate_interval_s``) renames inside the folder, so the folder must be
writable then too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from streamd.config._fields import Problems
from streamd.config.loader import Config
from streamd.config.sinks import JsonlSinkConfig
from streamd.config.streams import StreamConfig


def check_access(config: Config) -> list[str]:
    """Problems (config lines: ``file:line: key.path: ...``) with the stream files and the sink files."""
    problems = Problems(config.source, Path("."), config.lines)
    for index, stream in enumerate(config.streams):
        if not stream.is_live:
            why = stream_file_problem(stream)
            if why:
                problems.add(f"streams[{index}].url", why)
    for index, sink in enumerate(config.sinks):
        if isinstance(sink, JsonlSinkConfig):
            why = sink_problem(sink)
            if why:
                problems.add(f"sinks[{index}].path", why)
    return problems.messages()


def stream_file_problem(stream: StreamConfig) -> str | None:
    """Why the stream's file does not open as video (None: it does), as ``run`` would open it."""
    from streamd.ingest.sources import SourceError, open_stream

    assert stream.path is not None
    name = stream.path.name
    try:
        demuxer = open_stream(stream)
    except SourceError as exc:
        return f"{name!r} does not open as video: {str(exc).removeprefix('cannot open: ')}"
    try:
        first = next(iter(demuxer.packets()), None)
    except SourceError as exc:
        why = str(exc).removeprefix("read error: ")
        return f"{name!r} opens, but its first video packet cannot be read: {why}"
    finally:
        demuxer.close()
    return None if first is not None else f"{name!r} holds no video packet"


def sink_problem(sink: JsonlSinkConfig) -> str | None:
    """Why this user cannot append to the sink's file (None: it can); the file is not created or changed."""
    path = sink.path
    user = _user()
    try:
        st = os.stat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return f"cannot reach {str(path)!r} as user {user}: {exc.strerror or exc}"
    if st is not None:
        if stat.S_ISREG(st.st_mode):
            try:  # as the sink opens it: also right for root, read-only mounts, immutable files, /proc
                with open(path, "a", encoding="utf-8"):
                    pass  # appends nothing: the file is unchanged
            except OSError as exc:
                return f"cannot write {str(path)!r} as user {user}: {exc.strerror or exc}"
        elif not os.access(path, os.W_OK):  # a FIFO or a device: opening it could block or have effects
            return f"cannot write {str(path)!r} as user {user}: permission denied"
    folder = path.parent
    rotates = sink.rotate_bytes > 0 or sink.rotate_interval_s > 0
    if (st is None or rotates) and not os.access(folder, os.W_OK | os.X_OK):
        why = "to create the file" if st is None else "to rotate the file (rotate_bytes/rotate_interval_s)"
        return f"the folder {str(folder)!r} is not writable by user {user}; streamd needs that {why}"
    try:
        space = os.statvfs(folder)
    except OSError:
        return None
    if space.f_bavail == 0 and space.f_blocks > 0:
        return f"no space left on the file system of {str(folder)!r}"
    return None


def _user() -> str:
    import pwd

    uid = os.geteuid()
    try:
        return f"{pwd.getpwuid(uid).pw_name!r} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
