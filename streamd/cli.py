"""Command line: ``streamd run [CONFIG]``, ``streamd check CONFIG``, ``streamd build-engine [CONFIG]``."""

from __future__ import annotations

import argparse
import logging
import sys

from streamd import __version__
from streamd.config import EX_CONFIG, ConfigError, load_config


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
    check = sub.add_parser("check", help="validate a config file and exit (0 = valid, 78 = invalid)")
    check.add_argument("config", help="YAML config file")
    from streamd.engines.build import add_build_engine_parser  # argparse only; TensorRT loads on use

    add_build_engine_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command or "run"
    config_path = getattr(args, "config", None)
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"streamd: invalid config ({len(exc.problems)} problem(s)):", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return EX_CONFIG
    if command == "check":
        print(f"streamd: {config.source}: OK ({len(config.streams)} stream(s))", file=sys.stderr)
        return 0
    level = (getattr(args, "log_level", None) or config.log_level).upper()
    if command == "build-engine":
        from streamd.engines.build import run_build_engine

        logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        return run_build_engine(args, config)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    from streamd.daemon import Daemon  # imported late: `check` must not load engines

    status = False if getattr(args, "no_status", False) else None
    return Daemon(config, status_line=status).run()
