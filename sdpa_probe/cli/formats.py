"""--format, --output and --json: one meaning in check, bench, profile and sizing.

  --format table|md|csv|json|jsonl   what the command prints on stdout (default table:
                                     the tables fitted to the terminal; md: Markdown
                                     tables; csv / jsonl: a row per result; json: the
                                     whole document)
  --output FILE                      the --format output goes to FILE instead (stdout
                                     keeps the table); a file probe did not write is
                                     refused unless --force
  --json [PATH]                      the JSON document to PATH too ('-', or no
                                     PATH: stdout, the same as --format json; as
                                     --json means in the commands where it takes
                                     no value)
"""

from __future__ import annotations

import csv
import io
import json

import typer
from typer.core import TyperCommand

from ..errors import ProbeError
from ..outputs import _clean, check_writable, dumps, write_text

FORMATS = ("table", "md", "csv", "json", "jsonl")

FORMAT = typer.Option(
    "table", "--format", "-f", metavar="FORMAT",
    help="What stdout shows: table (fitted to the terminal), md (Markdown tables), csv "
         "or jsonl (a row per result), json (the whole document).")
OUTPUT = typer.Option(
    None, "--output", "-o", metavar="FILE",
    help="Write the --format output to FILE instead of stdout (the table stays on the "
         "terminal). An existing file is replaced only if probe wrote it, or with --force.")
FORCE = typer.Option(False, "--force", help="Replace an existing --output file that probe did "
                                            "not write, or a --save-baseline NAME, without "
                                            "asking.")


def json_option(what: str = "the JSON document"):
    """--json [PATH], the same in every command (with JsonPathCommand)."""
    return typer.Option(None, "--json", metavar="[PATH]",
                        help=f"Also write {what} to PATH (no PATH or '-': stdout, as "
                             "--format json).")


def bare_json_to_stdout(args: list[str]) -> list[str]:
    """A --json with no value (the last word, or an option next) reads as --json -:
    stdout, as --json means where it takes no value."""
    out: list[str] = []
    for i, a in enumerate(args):
        out.append(a)
        if a == "--json":
            after = args[i + 1] if i + 1 < len(args) else None
            if after is None or (after.startswith("-") and after != "-"):
                out.append("-")
    return out


class JsonPathCommand(TyperCommand):
    """A command whose --json takes an optional PATH (bare_json_to_stdout)."""

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, bare_json_to_stdout(list(args)))


def check_format(fmt: str, output: str | None, json_path: str | None, *, force: bool = False,
                 inputs=(), other_stdout: tuple[str | None, ...] = ()) -> None:
    """The --format / --output / --json combination, before any work."""
    if fmt not in FORMATS:
        raise ProbeError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if output is not None:
        if not output.strip():
            raise ProbeError("--output is empty: give a file")
        try:
            check_writable(output, "--output", inputs=inputs, force=force)
        except ProbeError as exc:
            hint = "; --force replaces it" if "not one of probe's reports" in str(exc) else ""
            raise ProbeError(f"{exc}{hint}") from None
    check_writable(json_path, "--json", inputs=inputs)
    takers = ["--json -"] if json_path == "-" else []
    takers += [f"--{name} -" for name in other_stdout if name]
    if fmt != "table" and output is None:
        takers.append(f"--format {fmt}")
    if len(takers) > 1:
        raise ProbeError(f"{' and '.join(takers)} both want stdout: give one of them a file "
                         "(--output FILE for --format)")


def stdout_is_data(fmt: str, output: str | None, json_path: str | None) -> bool:
    """Whether stdout carries a document (no table then)."""
    return json_path == "-" or (fmt != "table" and output is None)


def flat(row: dict, prefix: str = "") -> dict:
    """A nested result as one level: {"peers": {"torch": {"median_us": 1}}} becomes
    {"peers.torch.median_us": 1}; a list is written as JSON."""
    out: dict = {}
    for k, v in row.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flat(v, key + "."))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(_clean(list(v)))
        else:
            out[key] = v
    return out


def csv_text(command: str, rows: list[dict]) -> str:
    """Rows as CSV, a first column naming the command (how probe knows a file it may
    replace), the union of the rows' keys in first-seen order."""
    flats = [{"probe": command} | flat(_clean(r)) for r in rows]
    fields = list(dict.fromkeys(k for r in flats for k in r)) or ["probe"]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r in flats:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in fields})
    return buf.getvalue()


def jsonl_text(command: str, rows: list[dict]) -> str:
    return "".join(json.dumps({"probe": command} | _clean(r), allow_nan=False) + "\n"
                   for r in rows)


def render(fmt: str, command: str, doc: dict, rows: list[dict], md: str,
           csv_override: str | None = None) -> str:
    if fmt == "json":
        return dumps(doc) + "\n"
    if fmt == "jsonl":
        return jsonl_text(command, rows)
    if fmt == "csv":
        return csv_override if csv_override is not None else csv_text(command, rows)
    if fmt == "md":
        return md
    raise ValueError(fmt)


def deliver(out, fmt: str, output: str | None, command: str, doc: dict, rows,
            md, csv_override: str | None = None) -> None:
    """The --format output, to stdout or --output FILE. rows and md may be callables
    (made only when asked for). With the table format and --output, the file gets the
    table as plain text."""
    if fmt == "table":
        if output is not None:
            write_text(output, f"# probe {command}\n" + out.out.export_text(styles=False),
                       force=out.force)
        return
    rows = rows() if callable(rows) else rows
    md = md() if callable(md) else md
    text = render(fmt, command, doc, rows, md, csv_override)
    write_text(output or "-", text, force=out.force)
