"""The docs describe the code: status codes, refusal reasons, metrics, Redis
keys, identifier patterns and the repository paths they name; and they hold
together: every link lands on a file and a heading, the README stays short, and
its results are the figures of the benchmarks' results, and say met or missed
as bench/RESULTS.md does.

The code is the truth. Each test reads a table (or the code spans) out of the
Markdown, or the table in ``dataservice/redis/keys.py``'s docstring, compares it with
what the code defines, and names the doc line that disagrees. No services.
"""

from __future__ import annotations

import inspect
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from dataservice_tools.conformance.cases import CASES
from dataservice_tools.conformance.fleet import CALLER, PACED, PACED_RATE_PER_S, SCOPES

from dataservice import identifiers
from dataservice.cache.shadow import Outcome as ShadowOutcome
from dataservice.changes.behind import EVENTS_CAP
from dataservice.codec.requests import MAX_CURSOR_CHARS
from dataservice.enums import StatusCode
from dataservice.handler import failures
from dataservice.handler.failures import REASON_CODES
from dataservice.limits.local import RETRY_LOCAL_FULL_MS
from dataservice.limits.slots import RETRY_AT_CAP_MS
from dataservice.observe.metrics import REGISTRY, Dependency, Stage, TimeoutStage
from dataservice.proto import pb
from dataservice.redis import keys
from dataservice.refusals import ADMISSION_REASONS, Reason

ROOT = Path(__file__).resolve().parents[2]
PROTOCOL = ROOT / "docs" / "protocol.md"
OPERATIONS = ROOT / "docs" / "operations.md"
LOADTEST = ROOT / "docs" / "loadtest.md"
CHANGES = ROOT / "docs" / "changes.md"
CACHE = ROOT / "docs" / "cache.md"
README = ROOT / "README.md"
RESULTS = ROOT / "bench" / "RESULTS.md"
# A file per benchmark: its command, machine, latest figures and history.
BENCH_RESULTS = sorted((ROOT / "bench" / "results").glob("*.md"))
DOCS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "compose" / "README.md"]
# Every document whose links must land: the docs, and the benchmarks' figures.
LINKED = [*DOCS, RESULTS, *BENCH_RESULTS]
README_MAX_LINES = 200

REASONS = {reason.value for reason in Reason}


# Markdown ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    where: str  # "docs/protocol.md:160"
    cells: dict[str, str]  # by column header

    def __getitem__(self, column: str) -> str:
        return self.cells[column]


@dataclass(frozen=True)
class Table:
    where: str
    header: list[str]
    rows: list[Row]


def _where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def _cells(line: str) -> list[str]:
    # A `|` inside a cell is written `\|`.
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def tables(path: Path) -> list[Table]:
    """Every pipe table in a Markdown file."""
    lines = path.read_text().splitlines()
    found = []
    n = 0
    while n + 1 < len(lines):
        if not (lines[n].startswith("|") and re.fullmatch(r"\|[-:| ]+", lines[n + 1].strip())):
            n += 1
            continue
        header = _cells(lines[n])
        rows = []
        end = n + 2
        while end < len(lines) and lines[end].startswith("|"):
            cells = dict(zip(header, _cells(lines[end]), strict=False))
            rows.append(Row(_where(path, end + 1), cells))
            end += 1
        found.append(Table(_where(path, n + 1), header, rows))
        n = end
    return found


def table(path: Path, *columns: str) -> Table:
    """The one table in ``path`` whose header begins with ``columns``."""
    matches = [t for t in tables(path) if t.header[: len(columns)] == list(columns)]
    assert len(matches) == 1, f"{path.relative_to(ROOT)}: one table headed {columns} expected"
    return matches[0]


def _without_fences(text: str) -> str:
    """``text`` with fenced code blocks blanked out, line numbers kept."""
    lines = text.splitlines()
    fenced = False
    for n, line in enumerate(lines):
        fence = line.lstrip().startswith("```")
        if fenced or fence:
            lines[n] = ""
        fenced ^= fence
    return "\n".join(lines)


def fenced_lines(path: Path) -> Iterator[tuple[str, str]]:
    """(where, line) of every line inside a fenced code block."""
    fenced = False
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif fenced:
            yield _where(path, n), line


def code_spans(path: Path) -> Iterator[tuple[str, str]]:
    """(where, text) of every inline code span outside fenced blocks (one may wrap a line)."""
    text = _without_fences(path.read_text())
    for match in re.finditer(r"`([^`]+)`", text):
        if "\n\n" not in match.group(1):
            yield _where(path, text.count("\n", 0, match.start()) + 1), match.group(1)


def links(path: Path) -> Iterator[tuple[str, str, str]]:
    """(where, file, anchor) of every relative Markdown link; file "" for a link
    within ``path``, anchor "" for none."""
    text = _without_fences(path.read_text())
    for match in re.finditer(r"\]\(([^)\s#]*)(?:#([^)\s]*))?[^)]*\)", text):
        target, anchor = match.group(1), match.group(2) or ""
        if (target or anchor) and not re.match(r"[a-z]+:", target):
            yield _where(path, text.count("\n", 0, match.start()) + 1), target, anchor


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: its text as shown, lower case, punctuation
    dropped (hyphens kept), spaces as hyphens."""
    shown = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    return re.sub(r"[^\w\- ]", "", shown.strip().lower()).replace(" ", "-")


def headings(path: Path) -> list[tuple[int, str, str]]:
    """(level, text, anchor) of every heading outside fenced blocks, in order; a
    repeated anchor gets -1, -2, ... as on GitHub."""
    found = []
    seen: dict[str, int] = defaultdict(int)
    for line in _without_fences(path.read_text()).splitlines():
        match = re.match(r"(#{1,6}) +(.+?) *#* *$", line)
        if match:
            anchor = _anchor(match.group(2))
            unique = f"{anchor}-{seen[anchor]}" if seen[anchor] else anchor
            found.append((len(match.group(1)), match.group(2), unique))
            seen[anchor] += 1
    return found


def section(path: Path, anchor: str) -> str:
    """The text under the heading ``anchor`` up to the next heading of its level or above."""
    lines = _without_fences(path.read_text()).splitlines()
    found = headings(path)
    starts = [n for n, line in enumerate(lines) if re.match(r"#{1,6} ", line)]
    assert len(starts) == len(found)
    for i, (level, _text, name) in enumerate(found):
        if name == anchor:
            end = next(
                (starts[j] for j in range(i + 1, len(found)) if found[j][0] <= level), len(lines)
            )
            return "\n".join(lines[starts[i] : end])
    raise AssertionError(f"{path.relative_to(ROOT)}: no heading #{anchor}")


def _unquote(cell: str) -> str:
    match = re.fullmatch(r"`([^`]*)`", cell.strip())
    return match.group(1) if match else cell.strip()


def _reasons(cell: str) -> list[str]:
    """The reasons a cell names in backticks, leaving out what it says in parentheses."""
    return re.findall(r"`([a-z][a-z0-9_]*)`", re.sub(r"\([^)]*\)", "", cell))


def _codes(cell: str) -> set[str]:
    return set(re.findall(r"`([A-Z_]+)`", cell)) & {code.name for code in StatusCode}


# 1. Status codes --------------------------------------------------------------

WHEN = "when the service sends it"


def _status_rows() -> dict[str, Row]:
    rows = table(PROTOCOL, "code", "name").rows
    by_name = {_unquote(row["name"]): row for row in rows}
    assert len(by_name) == len(rows), "protocol.md: a status code is listed twice"
    return by_name


def test_status_code_table_lists_every_code_with_its_wire_number() -> None:
    documented = {name: int(row["code"]) for name, row in _status_rows().items()}
    # Every StatusCode member, and the wire's zero value, which is never sent.
    unspecified = pb.STATUS_CODE_UNSPECIFIED
    expected = {code.name: int(code) for code in StatusCode}
    expected[pb.StatusCode.Name(unspecified)] = unspecified
    assert documented == expected, "docs/protocol.md, Status codes"


def test_status_code_table_marks_exactly_the_retryable_codes() -> None:
    rows = _status_rows()
    for code in StatusCode:
        row = rows[code.name]
        says = "yes" in row["retryable"]
        assert says == code.retryable, f"{row.where}: {code.name} retryable is {code.retryable}"


def test_status_code_table_states_every_fixed_retry_after() -> None:
    fixed: dict[StatusCode, set[int]] = defaultdict(set)
    for answer, _message, retry_after_ms in failures._TABLE.values():
        code = REASON_CODES[answer] if isinstance(answer, Reason) else answer
        if code is not None and retry_after_ms:
            fixed[code].add(retry_after_ms)
    # The caller limits' own figures, answered with their reasons' codes.
    for reason, retry_after_ms in (
        (Reason.CONCURRENCY_LIMITED, RETRY_AT_CAP_MS),
        (Reason.LIMITS_UNAVAILABLE, RETRY_LOCAL_FULL_MS),
    ):
        fixed[REASON_CODES[reason]].add(retry_after_ms)
    rows = _status_rows()
    for code in StatusCode:
        row = rows[code.name]
        stated = re.findall(r"`retry_after_ms` = ([\d,]+)", row[WHEN])
        assert {int(n.replace(",", "")) for n in stated} == fixed[code], (
            f"{row.where}: {code.name} states retry_after_ms {stated}; "
            f"the code has {sorted(fixed[code])}"
        )


# 2. Refusal reasons -----------------------------------------------------------


def _check_tables() -> tuple[Table, Table, Table]:
    """protocol.md's refusal tables: admission at publish, the workers' checks,
    and the bounds on the way to the database."""
    checks = [t for t in tables(PROTOCOL) if t.header[0] == "check"]
    assert len(checks) == 2, "docs/protocol.md: admission's and the workers' checks, in two tables"
    admission, workers = checks
    assert "counted as" in workers.header[2], f"{workers.where}: the workers' checks come second"
    bounds = table(PROTOCOL, "bound", "refusal")
    return admission, workers, bounds


def test_refusal_tables_name_every_reason_with_its_status_code() -> None:
    named = set()
    for checks in _check_tables():
        refusal, reason_column = checks.header[1], checks.header[2]
        for row in checks.rows:
            codes = _codes(row[refusal])
            for reason in _reasons(row[reason_column]):
                assert reason in REASONS, f"{row.where}: `{reason}` is not a Reason"
                if codes:
                    expected = REASON_CODES[Reason(reason)].name
                    assert codes == {expected}, f"{row.where}: `{reason}` is answered {expected}"
                else:
                    assert row[refusal].startswith("dropped"), (
                        f"{row.where}: names no status code, yet does not say it drops"
                    )
                named.add(reason)
    assert named == REASONS, (
        f"protocol.md refusal tables: missing {sorted(REASONS - named)}, "
        f"unknown {sorted(named - REASONS)}"
    )


def test_status_code_table_puts_each_reason_it_names_under_its_code() -> None:
    for name, row in _status_rows().items():
        for reason in set(re.findall(r"`([a-z_]+)`", row[WHEN])) & REASONS:
            expected = REASON_CODES[Reason(reason)].name
            assert name == expected, f"{row.where}: `{reason}` is answered {expected}, not {name}"


def test_metrics_table_labels_are_the_closed_sets_the_workers_count() -> None:
    _admission, *workers = _check_tables()
    counted = {
        reason
        for checks in workers
        for row in checks.rows
        for reason in _reasons(row[checks.header[2]])
    }
    counters = {_unquote(row["counter"]): row for row in table(OPERATIONS, "counter").rows}
    for counter, labels in (
        ("dataservice_rejections_total", counted),
        ("dataservice_timeouts_total", {stage.value for stage in TimeoutStage}),
        ("dataservice_dependency_failures_total", {dep.value for dep in Dependency}),
        ("dataservice_stage_seconds", {stage.value for stage in Stage}),
        ("dataservice_admission_refusals_total", {reason.value for reason in ADMISSION_REASONS}),
    ):
        row = counters[counter]
        documented = set(_reasons(row["counts"]))
        assert documented == labels, (
            f"{row.where}: {counter} misses {sorted(labels - documented)} "
            f"and lists unknown {sorted(documented - labels)}"
        )


def test_metrics_table_names_every_metric_the_service_exports() -> None:
    exported = {
        family.name + ("_total" if family.type == "counter" else "")
        for family in REGISTRY.collect()
    }
    rows = {_unquote(row["counter"]): row.where for row in table(OPERATIONS, "counter").rows}
    assert not exported - rows.keys(), (
        f"operations.md metrics table misses {exported - rows.keys()}"
    )
    unknown = {name: where for name, where in rows.items() if name not in exported}
    assert not unknown, f"operations.md names metrics the service does not export: {unknown}"


def test_the_shadow_outcome_table_is_the_comparisons_outcomes() -> None:
    rows = table(CACHE, "outcome", "means").rows
    assert [_unquote(row["outcome"]) for row in rows] == [o.value for o in ShadowOutcome]


def test_the_change_stream_docs_state_the_cap_on_events_behind() -> None:
    cap = f"{EVENTS_CAP:,}"
    assert f"The count stops at **{cap}**" in CHANGES.read_text()
    row = next(r for r in table(OPERATIONS, "counter").rows if "lag_events" in r["counter"])
    assert f"counted up to {cap}" in row["counts"], row.where


# 3. Redis keys ----------------------------------------------------------------

# Sample arguments for keys.py's builders, by parameter name, and the same
# values for the placeholders the docs write.
SAMPLES: dict[str, object] = {
    "caller": "c4ller",
    "request_id": "r3quest",
    "channel": "ch4nnel",
    "queue": "qu3ue",
    "fmt": "v[12]",  # a glob: a cached record's key names either format
    "scope": "sc0pe",
    "object_id": "0bj:1d",
    "generation": 7,
    "generations": [7],
}
PLACEHOLDERS = {
    "scope": "sc0pe",
    "id": "0bj:1d",
    "gen": "7",
    "caller": "c4ller",
    "request id": "r3quest",
    "channel": "ch4nnel",
    "queue": "qu3ue",
    "lane queue": "qu3ue",
    "n": "1",  # a kombu priority
}
KEY = re.compile(
    r"(?<![\w-])(?:ds:|record:|_kombu\.|<(?:lane )?queue>\\x)(?:<[^<>]*>|[^\s`\"'<>,;()])+"
)


def _instantiate(pattern: str, where: str) -> str:
    """A documented key pattern with its placeholders filled in and escapes decoded."""

    def fill(match: re.Match[str]) -> str:
        assert match.group(1) in PLACEHOLDERS, f"{where}: unknown placeholder in {pattern!r}"
        return PLACEHOLDERS[match.group(1)]

    filled = re.sub(r"<([^<>]+)>", fill, pattern)
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), filled)


def _built() -> dict[str, str]:
    """What each builder in keys.py returns for the sample arguments."""
    built = {}
    for name, builder in vars(keys).items():
        if inspect.isfunction(builder) and builder.__module__ == keys.__name__:
            params = inspect.signature(builder).parameters
            assert set(params) <= set(SAMPLES), f"keys.{name}: no sample for {set(params)}"
            made = builder(**{p: SAMPLES[p] for p in params})
            if isinstance(made, list):  # the keys of one step, each built above too
                built.update((f"{name}[{i}]", key) for i, key in enumerate(made))
            else:
                built[name] = made
        elif name.endswith("_KEY") and isinstance(builder, str):
            built[name] = builder  # a fixed key
    return built


def _prefixes() -> dict[str, str]:
    return {name: value for name, value in vars(keys).items() if name.endswith("_PREFIX")}


def _names_key(concrete: str, built: str) -> bool:
    """Whether a documented key (filled in) is ``built``, or one of the keys it globs."""
    return concrete == built or ("*" not in concrete and fnmatchcase(concrete, built))


def _produced_by_keys(concrete: str) -> bool:
    if any(_names_key(concrete, built) for built in _built().values()):
        return True
    # A prefix itself, or every key under it.
    prefixes = set(_prefixes().values())
    return concrete in prefixes or (concrete.endswith("*") and concrete[:-1] in prefixes)


def _keys_table() -> list[str]:
    """The key column of the table in keys.py's docstring."""
    doc = keys.__doc__ or ""
    rules = [n for n, line in enumerate(doc.splitlines()) if re.fullmatch(r"=+ +=+", line)]
    assert len(rules) == 3, "keys.py: the docstring's table has a header and a body"
    body = doc.splitlines()[rules[1] + 1 : rules[2]]
    cells = [line.split("  ")[0] for line in body if line and not line[0].isspace()]
    return [cell.removeprefix("``").removesuffix("``") for cell in cells]


def _documented_keys() -> Iterator[tuple[str, str]]:
    """(where, pattern) of every key pattern the docs and keys.py's docstring name."""
    for doc in DOCS:
        for where, text in [*code_spans(doc), *fenced_lines(doc)]:
            for match in KEY.finditer(text):
                yield where, match.group(0)
    for span in re.findall(r"``([^`]+)``", keys.__doc__ or ""):
        for match in KEY.finditer(span):
            yield "dataservice/redis/keys.py docstring", match.group(0)


def test_every_documented_key_is_built_by_keys_py() -> None:
    documented = list(_documented_keys())
    assert documented, "no key patterns found in the docs"
    unknown = [
        f"{where}: {pattern!r}"
        for where, pattern in documented
        if not _produced_by_keys(_instantiate(pattern, where))
    ]
    assert not unknown, "keys no function or prefix of keys.py builds:\n" + "\n".join(unknown)


def test_keys_py_table_covers_every_builder_and_prefix() -> None:
    rows = {key: _instantiate(key, "keys.py docstring") for key in _keys_table()}
    for name, built in _built().items():
        assert any(_names_key(row, built) for row in rows.values()), (
            f"keys.{name} builds {built!r}; the docstring's table has no row for it"
        )
    documented = [_instantiate(p, w) for w, p in _documented_keys() if "keys.py" not in w]
    for name, prefix in _prefixes().items():
        assert any(row.startswith(prefix) for row in rows.values()), (
            f"keys.{name} ({prefix!r}) has no row in the docstring's table"
        )
        assert any(key.startswith(prefix) for key in documented), (
            f"keys.{name} ({prefix!r}) is named nowhere in the docs"
        )


# 4. Identifiers ---------------------------------------------------------------


def test_identifier_rules_are_the_patterns_of_identifiers_py() -> None:
    # The identifiers on the wire are the ones identifiers.py compiles.
    wire = {
        name.removesuffix("_RE").lower(): value.pattern
        for name, value in vars(identifiers).items()
        if name.endswith("_RE") and isinstance(value, re.Pattern)
    }
    documented = {}
    for row in table(PROTOCOL, "field", "pattern").rows:
        field = row["field"]
        if "cursor" in field:
            limit = re.fullmatch(r"at most ([\d,]+) characters", row["pattern"])
            assert limit, f"{row.where}: the cursor's bound is 'at most N characters'"
            assert int(limit.group(1).replace(",", "")) == MAX_CURSOR_CHARS, row.where
            continue
        documented[_unquote(field)] = (_unquote(row["pattern"]), row.where)
    assert set(documented) == set(wire), "docs/protocol.md, Identifier rules: fields"
    for field, (pattern, where) in documented.items():
        assert pattern == wire[field], f"{where}: `{field}` is {wire[field]!r} in identifiers.py"


# 5. Paths ---------------------------------------------------------------------

# The service's package, its tooling (load harness, demo, local servers), and the rest.
REPO_PATH = re.compile(
    r"(?<![\w./-])(?:dataservice|tools|tests|bench|scripts|compose|examples)/[\w./-]*"
)
# Files an operator creates; the docs say so where they name them.
CREATED_BY_OPERATOR = {"compose/.env"}


def test_every_repository_path_the_docs_name_exists() -> None:
    missing = []
    for doc in DOCS:
        for where, span in code_spans(doc):
            for match in REPO_PATH.finditer(span):
                path = match.group(0).rstrip(".")
                if path not in CREATED_BY_OPERATOR and not (ROOT / path).exists():
                    missing.append(f"{where}: `{path}`")
    assert not missing, "paths that do not exist:\n" + "\n".join(missing)


def test_every_link_lands_on_a_file_and_a_heading() -> None:
    broken = []
    for doc in LINKED:
        for where, target, anchor in links(doc):
            linked = (doc.parent / target).resolve() if target else doc
            if not linked.exists():
                broken.append(f"{where}: {target} does not exist")
            elif anchor and anchor not in {name for _level, _text, name in headings(linked)}:
                broken.append(f"{where}: {target or linked.name} has no heading #{anchor}")
    assert not broken, "links that land nowhere:\n" + "\n".join(broken)


# 6. The README ------------------------------------------------------------------

# A figure: a number, or a range of them (an en dash between), with its unit or as a
# ratio (0.41x; the multiplication sign too).
FIGURE = re.compile(r"\d+(?:[.,]\d+)*(?:\u2013\d+(?:[.,]\d+)*)?(?:x|\u00d7| ?%| ms| s|/s)(?!\w)")


def test_the_readme_is_a_short_way_in() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; at most {README_MAX_LINES}"


def _flat(path: Path) -> str:
    return " ".join(path.read_text().replace("**", "").split())


def _benchmark_file(cell: str, prefix: str) -> Path:
    link = re.fullmatch(rf"\[[^\]]+\]\({re.escape(prefix)}results/([\w-]+\.md)\)", cell)
    assert link, f"{cell!r} links to the benchmark's own file under {prefix}results/"
    path = ROOT / "bench" / "results" / link.group(1)
    assert path.exists(), f"{path.relative_to(ROOT)} does not exist"
    return path


def _verdicts() -> dict[Path, list[Row]]:
    """bench/RESULTS.md's latest verdicts: its rows, by the benchmark's file."""
    rows: dict[Path, list[Row]] = defaultdict(list)
    for row in table(RESULTS, "benchmark", "measure").rows:
        rows[_benchmark_file(row["benchmark"], "")].append(row)
    return rows


def test_the_readme_results_are_the_figures_of_the_benchmarks_they_link() -> None:
    rows = table(README, "benchmark").rows
    assert rows, "README.md: no results table"
    for row in rows:
        path = _benchmark_file(row["benchmark"], "bench/")
        figures = [figure for cell in row.cells.values() for figure in FIGURE.findall(cell)]
        assert figures, f"{row.where}: no figures"
        text = _flat(path)
        absent = [figure for figure in figures if figure not in text]
        assert not absent, f"{row.where}: {absent} not in {path.relative_to(ROOT)}"


def test_the_readme_says_met_or_missed_per_target_as_results_does() -> None:
    verdicts = _verdicts()
    for row in table(README, "benchmark").rows:
        path = _benchmark_file(row["benchmark"], "bench/")
        targets = verdicts.get(path)
        assert targets, f"{row.where}: bench/RESULTS.md has no verdict for {path.name}"
        expected = "; ".join(
            f"{t['measure']}: {t['met or missed']} on the {t['machine']}" for t in targets
        )
        assert row["met or missed"] == expected, f"{row.where}: bench/RESULTS.md says {expected!r}"


def test_the_results_page_gives_each_target_one_verdict_with_figures_of_its_benchmark() -> None:
    machines = {_unquote(row["machine"]) for row in table(RESULTS, "machine").rows}
    verdicts = _verdicts()
    assert set(verdicts) <= set(BENCH_RESULTS)
    for path, rows in verdicts.items():
        text = _flat(path)
        for row in rows:
            assert row["met or missed"] in ("met", "missed"), f"{row.where}: met or missed"
            assert row["machine"] in machines, f"{row.where}: {row['machine']} not under Machines"
            absent = [f for f in FIGURE.findall(row["latest"]) if f not in text]
            assert not absent, f"{row.where}: {absent} not in {path.relative_to(ROOT)}"


def test_every_benchmark_file_is_linked_from_the_results_page() -> None:
    linked = {(RESULTS.parent / target).resolve() for _where, target, _a in links(RESULTS)}
    assert BENCH_RESULTS, "bench/results/: no benchmark files"
    assert not [p.name for p in BENCH_RESULTS if p.resolve() not in linked]


# The machines' names, and what a run on each says of its CPU.
CPU_NAMES = {"Intel Xeon VM": "Xeon", "AMD EPYC VM": "EPYC"}


def test_each_machine_heading_names_the_machine_of_the_latest_figures() -> None:
    """The figures under a Machine heading came from the machine it names: the
    latest figures' own text says so, and so does the results page."""
    latest_machine = {path: rows[0]["machine"] for path, rows in _verdicts().items()}
    for path in BENCH_RESULTS:
        found = [text for level, text, _a in headings(path) if level == 2]
        machine = [t for t in found if re.match(r"Machines?: the ", t)]
        assert len(machine) == 1, f"{path.relative_to(ROOT)}: one Machine heading"
        named = re.match(r"Machines?: the (\w+ \w+ VM)", machine[0])
        assert named, f"{path.relative_to(ROOT)}: {machine[0]} names no machine"
        assert named.group(1) in CPU_NAMES, f"{path.relative_to(ROOT)}: {machine[0]}"
        latest = section(path, "latest-figures")
        assert CPU_NAMES[named.group(1)] in latest, (
            f"{path.relative_to(ROOT)}: the latest figures do not say they ran on the "
            f"{named.group(1)}"
        )
        if path in latest_machine:
            assert latest_machine[path] == named.group(1), (
                f"bench/RESULTS.md says {latest_machine[path]} for {path.name}"
            )


# 7. Load-test scenarios ---------------------------------------------------------


def test_the_scenario_table_lists_exactly_the_loadtest_scenarios() -> None:
    from dataservice_tools.loadtest.scenarios import SCENARIOS

    documented = [_unquote(row["scenario"]) for row in table(LOADTEST, "scenario").rows]
    assert documented == list(SCENARIOS), "docs/loadtest.md: scenarios"


# 8. Health exit codes -----------------------------------------------------------


def test_the_health_exit_table_is_health_exit() -> None:
    from dataservice.ops.health import HealthExit

    rows = table(OPERATIONS, "exit", "name").rows
    documented = {int(row["exit"]): _unquote(row["name"]) for row in rows}
    assert documented == {code.value: code.name for code in HealthExit}


def test_conformance_case_table_is_the_runners_cases_in_order() -> None:
    rows = table(ROOT / "docs" / "conformance.md", "case", "what the runner asks").rows
    assert [_unquote(row["case"]) for row in rows] == [case.name for case in CASES]


def test_conformance_doc_names_the_callers_the_runner_configures() -> None:
    text = (ROOT / "docs" / "conformance.md").read_text()
    for name in (CALLER, PACED, SCOPES):
        assert f"`{name}`" in text
    assert PACED_RATE_PER_S == 1.0
    assert "1 request a second, a burst of 1" in text
