"""The `gpuwatch` command line: run, record, advise, compare.

Each subcommand's work lives in its own module; this file only parses and dispatches.
Bad input is answered by the parser it belongs to (`gpuwatch run --bogus` with `run`'s
usage), naming the flag and what it expected, with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from gpuwatch import __version__
from gpuwatch.errors import UserError

DEFAULT_LISTEN = "127.0.0.1:9442"
DEFAULT_URL = "http://127.0.0.1:9442"


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds as a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def _interval(text: str) -> float:
    value = _seconds(text)
    if not 0.1 <= value <= 60:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 60 seconds, got {value:g}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds above 0, got {value:g}")
    return value


# `gpuwatch --help` ends with these; the README's usage block is the same text
# (tests/test_cli.py keeps the two equal)
EXAMPLES = """\
    gpuwatch run                                   # sample and serve on 127.0.0.1:9442
    gpuwatch run --web.listen-address :9442        # ... on all interfaces
    gpuwatch run --interval 0.5 --config.file /etc/gpuwatch/gpuwatch.yaml
    gpuwatch run --web.config.file web.yml         # TLS, client certs, basic auth (docs/security.md)
    gpuwatch run --demo                            # serve the bundled recording, no GPU needed
    gpuwatch run --record run.jsonl                # also record everything sampled
    gpuwatch run --replay run.jsonl                # serve a recording as if live (loops)
    gpuwatch record run.jsonl --duration 60        # record without serving
    gpuwatch run -- python train.py ARGS           # start a job with the torch hook injected
    gpuwatch advise --replay run.jsonl             # what to change, with the evidence
    gpuwatch advise --demo                         # ... for the bundled recording
    gpuwatch advise                                # ... for what the running daemon sees
    gpuwatch advise --prometheus http://prom:9090  # ... fleet-wide, from Prometheus, per host
    gpuwatch advise --prometheus http://prom:9090 --match 'instance=~"gpu-1.*"' --window 3600
    gpuwatch advise --replay run.jsonl --format json   # or markdown; text by default
    gpuwatch advise --replay run.jsonl --format html > report.html  # one page with charts
    gpuwatch compare before.jsonl after.jsonl      # did the change pay off? (ratios, advice gone)
    gpuwatch compare before.jsonl http://127.0.0.1:9442   # ... against the running daemon
"""


LOG_LEVELS = ["debug", "info", "warning", "error"]


def _add_log_level(p: argparse.ArgumentParser, default: object) -> None:
    # accepted before and after the subcommand; a subcommand's own default must not
    # overwrite a value given before it, hence SUPPRESS there
    p.add_argument("--log.level", dest="log_level", default=default, choices=LOG_LEVELS,
                   help="how much to log on stderr (default info)")


def _add_daemon_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config.file", dest="config_file", metavar="FILE",
                   help="YAML configuration file (flags given here override it)")
    p.add_argument("--interval", type=_interval, default=None, metavar="SECONDS",
                   help="sampling interval, 0.1 to 60 (default 1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuwatch",
        description="GPU monitoring daemon, Prometheus exporter and training advisor.",
        epilog="examples:\n" + EXAMPLES + "\n`gpuwatch COMMAND --help` lists a command's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"gpuwatch {__version__}")
    _add_log_level(parser, "info")
    sub = parser.add_subparsers(dest="cmd", metavar="COMMAND")

    run = sub.add_parser(
        "run",
        help="sample every GPU and the host, serve /metrics (optionally start a job: run -- CMD)",
        description="Sample every GPU and the host and serve them to Prometheus. "
        "`gpuwatch run -- python train.py ARGS` also starts the job with the torch hook injected.",
    )
    _add_daemon_flags(run)
    _add_log_level(run, argparse.SUPPRESS)
    run.add_argument("--web.listen-address", dest="listen_address", default=None, metavar="ADDR",
                     help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN}; ':9442' for all interfaces)")
    run.add_argument("--web.config.file", dest="web_config_file", default=None, metavar="FILE",
                     help="TLS and basic auth for the HTTP server (Prometheus exporter-toolkit "
                     "format, see docs/security.md)")
    run.add_argument("--replay", metavar="FILE",
                     help="serve a gpuwatch-trace/1 recording as if live, looping at its end")
    run.add_argument("--demo", action="store_true",
                     help="replay the bundled recording (no GPU needed)")
    run.add_argument("--record", metavar="FILE", help="also record what is sampled to FILE")
    status = run.add_mutually_exclusive_group()
    status.add_argument("--status", dest="status", action="store_true", default=None,
                        help="show the live status line while a job runs (default: when stderr is a terminal)")
    status.add_argument("--quiet", dest="status", action="store_false",
                        help="no status line")
    run.add_argument("command", nargs=argparse.REMAINDER,
                     help="-- CMD ARGS: the training job to start with the hook injected")

    rec = sub.add_parser("record", help="record what the daemon samples to a trace file",
                         description="Sample like `gpuwatch run` and write gpuwatch-trace/1 lines to FILE.")
    _add_daemon_flags(rec)
    _add_log_level(rec, argparse.SUPPRESS)
    rec.add_argument("file", metavar="FILE", help="output file ('-' for stdout)")
    rec.add_argument("--duration", type=_positive_seconds, default=None, metavar="SECONDS",
                     help="stop after this long (default: until interrupted)")
    rec.add_argument("--scenario", default=None, help="free text stored in the meta line")

    adv = sub.add_parser("advise", help="what to change, with the evidence",
                         description="Judge a run and say what to change: from the running daemon "
                         "(--url), a recording (--replay) or a Prometheus server (--prometheus).")
    src = adv.add_mutually_exclusive_group()
    src.add_argument("--url", default=None, help=f"a running daemon (default {DEFAULT_URL})")
    src.add_argument("--replay", metavar="FILE",
                     help="judge a gpuwatch-trace/1 recording, plain or gzip; - reads it "
                          "from standard input (a long one of several GPUs in several "
                          "processes; GPUWATCH_REPLAY_WORKERS=1 keeps one)")
    src.add_argument("--demo", action="store_true", help="judge the bundled recording")
    src.add_argument("--prometheus", metavar="URL", help="fleet-wide, from a Prometheus server")
    _add_log_level(adv, argparse.SUPPRESS)
    adv.add_argument("--format", choices=["text", "json", "markdown", "html"], default="text",
                     help="text (default), markdown, json (the /api/advice body; "
                     "docs/report.md), or html: one self-contained page with charts (of a "
                     "recording), e.g. > report.html")
    adv.add_argument("--rules-dir", action="append", default=[], metavar="DIR",
                     help="extra directory of rule files (repeatable; not with --url)")
    adv.add_argument("--config.file", dest="config_file", metavar="FILE",
                     help="a gpuwatch configuration file: its rules_dirs add rule files as "
                     "--rules-dir does (not with --url)")
    adv.add_argument("--window", type=_positive_seconds, default=None, metavar="SECONDS",
                     help="with --prometheus: how far back to judge (default 600)")
    adv.add_argument("--match", default=None, metavar="SELECTOR",
                     help="with --prometheus: only series matching these label matchers, "
                     "e.g. 'instance=~\"gpu-1.*\"'")

    cmp = sub.add_parser("compare", help="two runs side by side: did the change pay off?",
                         description="Compare two runs: samples/s and step time with the "
                         "ratio, util, SM active and memory, the step-time breakdown and the "
                         "advice that went away or is new. BEFORE and AFTER are recordings "
                         "(gpuwatch-trace/1) or a running daemon's URL (http://HOST:PORT). "
                         "Exits 3 when the runs don't compare (another model, no step data).")
    cmp.add_argument("before", metavar="BEFORE", help="a recording, or http://HOST:PORT")
    cmp.add_argument("after", metavar="AFTER", help="a recording, or http://HOST:PORT")
    cmp.add_argument("--format", choices=["text", "json", "markdown", "html"], default="text",
                     help="text (default), markdown, json, or html (one page, offline)")
    cmp.add_argument("--force", action="store_true",
                     help="compare even runs that don't compare (the reasons are kept)")
    cmp.add_argument("--rules-dir", action="append", default=[], metavar="DIR",
                     help="extra directory of rule files (repeatable)")
    cmp.add_argument("--config.file", dest="config_file", metavar="FILE",
                     help="a gpuwatch configuration file: its rules_dirs add rule files as "
                     "--rules-dir does")
    _add_log_level(cmp, argparse.SUPPRESS)
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, but an unknown flag is reported by the subcommand it was
    given to, with that subcommand's usage (argparse leaves it to the top level)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        sub = _subparsers(parser).get(getattr(args, "cmd", None) or "")
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    if args.cmd is None:
        parser.print_help(sys.stderr)
        return 2
    from gpuwatch import logs

    logs.setup(args.log_level)
    try:
        if args.cmd == "run":
            command = list(args.command)
            if command and command[0] == "--":
                command = command[1:]
            args.command = command
            if command:
                from gpuwatch import launcher

                return launcher.main(args)
            from gpuwatch import daemon

            return daemon.main(args)
        if args.cmd == "record":
            from gpuwatch import daemon

            return daemon.record_main(args)
        if args.cmd == "advise":
            from gpuwatch import advise

            return advise.main(args)
        if args.cmd == "compare":
            from gpuwatch.advisor import compare

            return compare.main(args)
    except KeyboardInterrupt:
        return 130
    except UserError as err:
        print(f"gpuwatch: error: {err}", file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
