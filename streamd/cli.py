"""Command line: ``streamd run [CONFIG]``, ``streamd check CONFIG``, ``streamd build-engine [CONFIG]``,
``streamd reload --pid PID`` (``systemctl reload``: signal the daemon, exit 1 when it refused the config).

Every start-up failure ends here as one line on stderr and a documented exit code (``streamd/exitcodes.py``):
a bad config or a model that does not fit it 78, a missing GPU/driver/engine 69, an output that cannot be
created 73, a bug 70 (its traceback only with ``--log-level debug``). Until the daemon installs its own
handlers, SIGTERM and SIGINT stop start-up with one line and exit 0: nothing was running yet.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import logging
import signal
import sys
from types import FrameType

from streamd import __version__
from streamd.exitcodes import EX_CONFIG, EX_OK, EX_SOFTWARE, StartupError

log = logging.getLogger("streamd")


class _StoppedEarly(BaseException):
    """SIGTERM/SIGINT arrived before the daemon took over signal handling (a BaseException, like
    KeyboardInterrupt, so that no `except Exception` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)


def _stop_early(signum: int, _frame: FrameType | None) -> None:
    raise _StoppedEarly(signum)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="streamd", description="Video streams -> object detection -> JSON lines."
    )
    p.add_argument("--version", action="version", version=f"streamd {__version__}")
    sub = p.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run the daemon (no CONFIG: the bundled demo)")
    run.add_argument("config", nargs="?", help="YAML config file (default: the bundled demo config)")
    run.add_argument("--log-level", choices=["debug", "info", "warning", "error"], help="overrides log_level")
    run.add_argument("--no-status", action="store_true", help="no one-line status display on stderr")
    check = sub.add_parser(
        "check",
        help="validate a config file, its stream files, its output files (as this user) and its model, "
        "and exit (0 = valid, 78 = invalid)",
    )
    check.add_argument("config", help="YAML config file")
    check.add_argument(
        "--no-model",
        action="store_true",
        help="skip the model check (the model file need not exist, e.g. on a box without the model)",
    )
    reload = sub.add_parser(
        "reload", help="ask a running daemon to reload its config and wait for the outcome (0 = applied)"
    )
    reload.add_argument("--pid", type=int, required=True, help="the daemon's pid (systemd: $MAINPID)")
    reload.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the outcome")
    from streamd.build_engine import add_build_engine_parser  # argparse only; TensorRT loads on use

    add_build_engine_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    with contextlib.suppress(ValueError, OSError):  # stderr may have no file descriptor (embedded, tests)
        faulthandler.enable()  # a fatal signal (the watchdog sends SIGABRT) leaves the stacks in the journal
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for signum in previous:  # inside the try: a signal may arrive while the handler is being installed
            signal.signal(signum, _stop_early)
        args = _parser().parse_args(argv)
        if args.command == "reload":  # a client of the running daemon: no config of its own
            from streamd.supervisor.control import request_reload

            return request_reload(args.pid, args.timeout)
        return _main(args, args.command or "run")
    except StartupError as exc:
        print(f"streamd: {exc}", file=sys.stderr)
        return exc.code
    except _StoppedEarly as exc:
        print(f"streamd: {exc} before start-up finished; stopped (nothing was running yet)", file=sys.stderr)
        return EX_OK
    except Exception as exc:  # a bug: one line; the traceback at debug level
        log.debug("start-up failed", exc_info=True)
        print(
            f"streamd: internal error: {type(exc).__name__}: {exc} (--log-level debug shows where)",
            file=sys.stderr,
        )
        return EX_SOFTWARE
    finally:  # the daemon replaced these with its own while it ran; put back what the caller had
        for signum, handler in previous.items():  # None: installed outside Python; the default instead
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)


def _print_problems(problems: list[str]) -> None:
    print(f"streamd: invalid config ({len(problems)} problem(s)):", file=sys.stderr)
    for problem in problems:
        print(f"  {problem}", file=sys.stderr)


def _main(args: argparse.Namespace, command: str) -> int:
    from streamd.config import ConfigError  # imported after the handlers are in place: it takes a while

    try:
        return _command(args, command)
    except ConfigError as exc:
        _print_problems(exc.problems)
        return EX_CONFIG


def _check(path: str, model: bool) -> int:
    """``streamd check``: the config, its stream files and sink files as this user sees them
    (``streamd.checks.access``); with ``model``, the model file against the config (onnx is imported only
    then, so that ``--no-model`` stays quick)."""
    from streamd.analytics.tracker import missing_dependency
    from streamd.checks.access import check_access
    from streamd.config import ConfigError, load_config

    config = load_config(path, model_file=model)
    problems = check_access(config)
    missing = missing_dependency(config.streams, config.tracking)
    if missing:
        problems.append(missing)
    summary = ""
    if model:
        from streamd.checks.model import check_model

        report = check_model(config)
        problems += report.problems
        if not problems:
            for note in report.notes:
                print(f"streamd: note: {note}", file=sys.stderr)
        summary = f"; {report.summary}"
    if problems:
        raise ConfigError(problems)
    if model:  # not with --no-model: that one stays quick (no nvidia-smi call)
        from streamd.checks.memory import check_memory

        memory = check_memory(config)  # a warning, never a refusal: the estimate is a sizing aid
        for note in memory.notes:
            print(f"streamd: note: {note}", file=sys.stderr)
        for warning in memory.warnings:
            print(f"streamd: warning: {warning}", file=sys.stderr)
        if memory.per_device_mb:  # a GPU is visible and the config uses it: the GPU path's worker figures
            from streamd.checks.load import check_load

            for warning in check_load(config):
                print(f"streamd: warning: {warning}", file=sys.stderr)
        from streamd.checks.toolchain import compile_warning

        if uncompiled := compile_warning(config):
            print(f"streamd: warning: {uncompiled}", file=sys.stderr)
    print(f"streamd: {config.source}: OK ({len(config.streams)} stream(s){summary})", file=sys.stderr)
    return EX_OK


def _command(args: argparse.Namespace, command: str) -> int:
    from streamd.config import ConfigError, load_config

    if command == "check":
        return _check(args.config, model=not args.no_model)
    config = load_config(getattr(args, "config", None))
    level = (getattr(args, "log_level", None) or config.log_level).upper()
    if command == "build-engine":
        from streamd.build_engine import run_build_engine

        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        return run_build_engine(args, config)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from streamd.checks.model import check_model

    report = check_model(config)  # the same model check as `streamd check`: refuse before anything starts
    if report.problems:
        raise ConfigError(report.problems)
    from streamd.supervisor import Supervisor  # imported late: `check` must not load engines

    status = False if getattr(args, "no_status", False) else None
    return Supervisor(config, status_line=status).run()
