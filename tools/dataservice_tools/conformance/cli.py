"""``dataservice conformance --caller CMD``: start the service, drive the
caller program through every case, print a line per case and the count."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import typer

from dataservice.cli.common import fail, load
from dataservice.config.settings import Settings
from dataservice.errors import DataServiceError
from dataservice_tools.conformance.cases import CASES, Case, Run
from dataservice_tools.conformance.fleet import Fleet
from dataservice_tools.conformance.interface import CallerInterfaceError
from dataservice_tools.conformance.program import CallerProgram

BROKERS = ("redis", "rabbitmq")


def run_conformance(
    say: Callable[[str], None],
    settings: Settings,
    command: str,
    broker: str,
    log_dir: Path,
    cases: Sequence[Case] = CASES,
) -> tuple[int, int]:
    """Every case against the caller ``command`` on ``broker``; (passed, failed).
    A line per case goes to ``say``; the workers log in ``log_dir``. The
    service's own setup failing raises."""
    fleet = Fleet(settings, settings.config_path, broker, log_dir)
    passed = failed = 0
    try:
        fleet.start()
        say(f"service: one worker per lane on {broker}; logs in {fleet.log_dir}")
        program = CallerProgram(command, env=fleet.caller_env())
        try:
            program.hello(fleet.hello())
            say(f"caller: {program.name}")
            run = Run.new(program, fleet)
            for case in cases:
                try:
                    problems = case.run(run)
                except CallerInterfaceError as exc:
                    problems = [str(exc)]
                except Exception as exc:
                    # A result the checks could not read (a field of the wrong
                    # type, say) fails its case, not the run.
                    problems = [f"{type(exc).__name__}: {exc}"]
                if problems:
                    failed += 1
                    say(f"FAIL {case.name}: {'; '.join(problems)}")
                else:
                    passed += 1
                    say(f"pass {case.name}")
        except CallerInterfaceError as exc:
            say(f"FAIL the caller: {exc}")
            failed += len(cases) - passed - failed
        finally:
            program.close()
    finally:
        fleet.stop()
    say(f"{passed} passed, {failed} failed")
    return passed, failed


def conformance(
    caller: str = typer.Option(
        ..., "--caller", help='The caller program, e.g. "node examples/node/caller.js".'
    ),
    broker: str = typer.Option(
        "redis",
        help="redis (a private redis-server) or rabbitmq (a virtual host of the run's own on "
        "the local RabbitMQ, the answers in a private redis-server).",
    ),
    log_dir: Path = typer.Option(Path(".state/conformance"), help="Where the workers log."),
    case: list[str] = typer.Option([], help="Run only these cases (repeatable)."),
) -> None:
    """Check a caller program in any language against the service
    (docs/conformance.md); exit 0 when every case passed."""
    settings, _ = load()
    if broker not in BROKERS:
        raise fail(DataServiceError(f"--broker must be one of {', '.join(BROKERS)}"), 2)
    known = {c.name: c for c in CASES}
    unknown = [name for name in case if name not in known]
    if unknown:
        raise fail(DataServiceError(f"unknown case(s) {', '.join(unknown)}"), 2)
    chosen = [known[name] for name in case] if case else CASES
    try:
        _, failed = run_conformance(
            typer.echo,
            settings,
            caller,
            broker,
            log_dir / broker,
            chosen,
        )
    except DataServiceError as exc:
        raise fail(exc, 2) from None
    raise typer.Exit(1 if failed else 0)
