"""The `nodeledger` command: serve the API, or manage the database schema."""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from app import __version__
from app.db import migrate
from app.db.engine import create_db_engine
from app.logs import configure_logging, uvicorn_log_options
from app.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        key: value
        for key in ("database_url", "host", "port", "log_level", "log_format")
        if (value := getattr(args, key, None)) is not None
    }
    return Settings(**overrides)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.auth.tls import uvicorn_options
    from app.main import create_app

    settings = _settings(args)
    configure_logging(settings.log_level, settings.log_format, settings.log_library_level)
    app = create_app(settings)
    # uvicorn stops gracefully on SIGTERM, then raises it again to end as a TERM would:
    # with the default action, that skips atexit, where the kubernetes client removes the
    # files it wrote a kubeconfig's inline credentials to (a private key), so every
    # restart left them in /tmp. Raised again, it now ends the interpreter: status 0.
    signal.signal(signal.SIGTERM, _exit_gracefully)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # One line per request costs a tenth of the admission path: only when debugging.
        access_log=settings.log_level == "debug",
        workers=1,
        **uvicorn_log_options(settings.log_format),  # JSON: uvicorn's lines too
        # The head deadline; HTTPS and client certificates, when configured.
        **uvicorn_options(settings.auth, head_timeout=settings.request_timeout_seconds),
    )
    return 0


def _exit_gracefully(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _db(args: argparse.Namespace) -> int:
    settings = _settings(args)
    engine = create_db_engine(settings.database_url)
    try:
        if args.db_command == "upgrade":
            migrate.upgrade(engine, args.revision)
        elif args.db_command == "downgrade":
            migrate.downgrade(engine, args.revision)
        print(migrate.current(engine) or "empty")
    finally:
        engine.dispose()
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="nodeledger", description=__doc__)
    root.add_argument("--version", action="version", version=f"nodeledger {__version__}")
    commands = root.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--database-url", help="overrides NODELEDGER_DATABASE_URL")
        p.add_argument(
            "--log-level",
            choices=["debug", "info", "warning", "error", "critical"],
            help="overrides NODELEDGER_LOG_LEVEL",
        )

    serve = commands.add_parser("serve", help="upgrade the schema, then serve the API")
    common(serve)
    serve.add_argument("--host", help="overrides NODELEDGER_HOST (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="overrides NODELEDGER_PORT (default 8080)")
    serve.add_argument(
        "--log-format", choices=["text", "json"], help="overrides NODELEDGER_LOG_FORMAT"
    )
    serve.set_defaults(run=_serve)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate to a revision (default head)")
    upgrade.add_argument("revision", nargs="?", default="head")
    downgrade = db_commands.add_parser("downgrade", help="migrate down to a revision")
    downgrade.add_argument("revision")
    current = db_commands.add_parser("current", help="print the current revision")
    for p in (upgrade, downgrade, current):
        common(p)
    db.set_defaults(run=_db)
    return root


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    code: int = args.run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
