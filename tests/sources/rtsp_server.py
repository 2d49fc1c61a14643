"""A real RTSP server for the tests: GStreamer's RTSP server (Debian packages), serving one clip.

Run with the system Python, which has PyGObject (the venv does not):

    /usr/bin/python3 tests/sources/rtsp_server.py --port 8554 --clip samples/vtest.mp4 [--codec h264|h265]
        [--user NAME --password SECRET]

Serves ``rtsp://127.0.0.1:PORT/test`` (bound to 127.0.0.1 only). Each client gets its own pipeline that plays
the clip from its start at its native rate (GStreamer paces it against the clock, like a camera), looping
forever with ``--loop``. Prints ``READY <port>`` on stdout once it listens; exits on SIGTERM/SIGINT. The tests
kill it (SIGKILL) to simulate a camera that drops and start it again on the same port to simulate recovery.
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402

_PARSE = {"h264": ("h264parse", "rtph264pay"), "h265": ("h265parse", "rtph265pay")}


def launch_line(clip: str, codec: str) -> str:
    parse, pay = _PARSE[codec]
    # config-interval=-1: parameter sets before every IDR frame, so a client that joins late can start.
    return f"( filesrc location={clip} ! qtdemux ! {parse} ! {pay} name=pay0 pt=96 config-interval=-1 )"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clip", required=True)
    ap.add_argument("--codec", choices=sorted(_PARSE), default="h264")
    ap.add_argument("--path", default="/test")
    ap.add_argument("--user", help="require this login (basic authentication) with --password")
    ap.add_argument("--password", default="")
    args = ap.parse_args()

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch_line(args.clip, args.codec))
    factory.set_shared(False)
    if args.user:
        auth = GstRtspServer.RTSPAuth()
        token = GstRtspServer.RTSPToken()
        token.set_string("media.factory.role", "viewer")
        auth.add_basic(GstRtspServer.RTSPAuth.make_basic(args.user, args.password), token)
        server.set_auth(auth)
        permissions = GstRtspServer.RTSPPermissions()
        permissions.add_permission_for_role("viewer", "media.factory.access", True)
        permissions.add_permission_for_role("viewer", "media.factory.construct", True)
        factory.set_permissions(permissions)
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        print(f"cannot listen on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
        return 2

    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"READY {args.port}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
