"""Tables that fit the terminal: a Sheet is a table's columns (each with a kind and a
place in the drop order) and rows; fit() chooses the columns and widths for a console
width, never by cutting a number or an id.

The order in which a table gives up width, stated once for every command:
  1. bar columns narrow to their least width, then leave;
  2. text columns (prose: reasons, verdicts) wrap down to their least width;
  3. columns with a drop rank leave, rank 1 first, then 2, ...;
  4. if the columns that are never dropped still do not fit, each row is printed
     stacked: its ids on a line, then "header: value" pairs packed into lines.
Id and number columns are as wide as their widest cell; a column that left is named
under the table."""

from __future__ import annotations

import dataclasses

from rich import box
from rich.console import Group
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

KINDS = ("id", "num", "text", "bar")
TEXT_LEAST = 16   # a prose column wraps no narrower than this
BAR_LEAST = 6


@dataclasses.dataclass
class Col:
    header: str
    kind: str = "num"        # one of KINDS
    drop: int = 0            # rank in the drop order (1 leaves first); 0: never dropped
    style: str | None = None
    justify: str | None = None  # default: right for numbers, left otherwise
    least: int | None = None    # text / bar: the narrowest it may become

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"column kind {self.kind!r} is not one of {KINDS}")


@dataclasses.dataclass
class Sheet:
    cols: list[Col]
    title: str | None = None
    rows: list[list] = dataclasses.field(default_factory=list)
    styles: list[str | None] = dataclasses.field(default_factory=list)
    breaks: set[int] = dataclasses.field(default_factory=set)  # a rule before these rows

    def add_row(self, *cells, style: str | None = None) -> None:
        if len(cells) != len(self.cols):
            raise ValueError(f"{len(cells)} cells for {len(self.cols)} columns")
        self.rows.append(list(cells))
        self.styles.append(style)

    def add_section(self) -> None:
        self.breaks.add(len(self.rows))


def plain(cell) -> str:
    """A cell's text without its markup."""
    if cell is None:
        return ""
    if isinstance(cell, Text):
        return cell.plain
    return Text.from_markup(str(cell)).plain


def _lines(cell) -> list[str]:
    return plain(cell).split("\n")


def overhead(n: int) -> int:
    """Columns a table of n columns spends outside its cells (the style render() draws:
    no outer edge, one space of padding each side between columns, one rule)."""
    return max(0, 3 * n - 3)


def _sizes(sheet: Sheet, i: int) -> tuple[int, int]:
    """A column's (least, natural) width."""
    col = sheet.cols[i]
    lines = [ln for row in sheet.rows for ln in _lines(row[i])]
    longest = max((len(ln) for ln in lines), default=0)
    head_words = max((len(w) for w in col.header.split()), default=0)
    want = max(longest, len(col.header))
    if col.kind in ("id", "num"):
        return max(longest, head_words), want
    if col.kind == "bar":
        return min(want, max(col.least or BAR_LEAST, head_words)), want
    words = max((len(w) for ln in lines for w in ln.split()), default=0)
    least = max(head_words, min(want, col.least or TEXT_LEAST), min(words, col.least or 0))
    return least, want


@dataclasses.dataclass
class Fit:
    shown: list[int]          # column indices, in order
    widths: dict[int, int]
    dropped: list[int]
    stacked: bool = False


def fit(sheet: Sheet, width: int) -> Fit:
    """The columns and widths of sheet at a console width (the order in the module's
    docstring)."""
    n = len(sheet.cols)
    sizes = [_sizes(sheet, i) for i in range(n)]
    least, want = [s[0] for s in sizes], [s[1] for s in sizes]
    shown = list(range(n))
    widths = dict(enumerate(want))

    def total() -> int:
        return sum(widths[i] for i in shown) + overhead(len(shown))

    def spread() -> None:  # text columns share what is left, up to their natural width
        text = [i for i in shown if sheet.cols[i].kind == "text"]
        for i in text:
            widths[i] = least[i]
        spare = width - total()
        while spare > 0 and text:
            grow = [i for i in text if widths[i] < want[i]]
            if not grow:
                break
            step = max(1, spare // len(grow))
            for i in grow:
                add = min(step, want[i] - widths[i], spare)
                widths[i] += add
                spare -= add

    bars = [i for i in shown if sheet.cols[i].kind == "bar"]
    for i in bars:
        if total() > width:
            widths[i] = least[i]
    for i in bars:
        if total() > width:
            shown.remove(i)
    if total() > width:
        spread()
    ranked = sorted((i for i in shown if sheet.cols[i].drop), key=lambda i: sheet.cols[i].drop)
    for i in ranked:
        if total() <= width:
            break
        shown.remove(i)
        spread()
    dropped = [i for i in range(n) if i not in shown]
    return Fit(shown, widths, dropped, stacked=total() > width)


def render(sheet: Sheet, width: int):
    """A Rich renderable of sheet that fits width (a table, or the stacked rows), with
    a line naming the columns it left out."""
    f = fit(sheet, width)
    if f.stacked:
        body = stacked(sheet, width)
    else:
        t = Table(title=sheet.title, title_justify="left", box=box.HEAVY_HEAD,
                  show_edge=False, pad_edge=False)
        for i in f.shown:
            col = sheet.cols[i]
            just = col.justify or ("right" if col.kind == "num" else "left")
            t.add_column(col.header, justify=just, style=col.style, width=f.widths[i],
                         no_wrap=col.kind != "text", overflow="fold")
        for r, (row, style) in enumerate(zip(sheet.rows, sheet.styles, strict=True)):
            if r in sheet.breaks and r:
                t.add_section()
            t.add_row(*(_cell(row[i]) for i in f.shown), style=style)
        body = t
    left = [] if f.stacked else [sheet.cols[i].header or "bar" for i in f.dropped]
    if not left:
        return body
    note = Text(f"(left out at {width} columns: {', '.join(left)}; a wider terminal or "
                "--format md|csv|json shows every column)", style="dim")
    return Group(body, note)


def _cell(cell):
    return "" if cell is None else cell


def stacked(sheet: Sheet, width: int):
    """Each row as its id cells on a line, then the other cells as "header: value",
    figures packed into lines of at most width, prose on lines of its own."""
    ids = [i for i, c in enumerate(sheet.cols) if c.kind == "id"] or [0]
    rest = [i for i, c in enumerate(sheet.cols) if i not in ids and c.kind != "bar"]
    out: list = []
    if sheet.title:
        out.append(Text(sheet.title, style="bold"))

    def fixed(line: str) -> Text:
        return Text(line, no_wrap=False, overflow="fold")

    for row in sheet.rows:
        out.append(Text("  ".join(plain(row[i]) for i in ids), style="bold", overflow="fold"))
        line, prose = "", []
        for i in rest:
            value = " / ".join(ln for ln in _lines(row[i]) if ln.strip())
            if not value.strip():
                continue
            item = f"{sheet.cols[i].header or '-'}: {value}"
            if sheet.cols[i].kind == "text":
                prose.append(Padding(Text(item), (0, 0, 0, 3)))
                continue
            if line and 3 + len(line) + 2 + len(item) > width:
                out.append(Padding(fixed(line), (0, 0, 0, 3)))
                line = ""
            line += ("  " if line else "") + item
        if line:
            out.append(Padding(fixed(line), (0, 0, 0, 3)))
        out += prose
    return Group(*out)


def markdown(sheet: Sheet) -> str:
    """The sheet as a Markdown pipe table, every column but the bars, cells in plain
    text."""
    cols = [i for i, c in enumerate(sheet.cols) if c.kind != "bar"]

    def esc(s: str) -> str:
        return s.replace("|", "\\|").replace("\n", "<br>")

    head = "| " + " | ".join(esc(sheet.cols[i].header) for i in cols) + " |"
    rule = "|" + "|".join("---:" if sheet.cols[i].kind == "num" else "---" for i in cols) + "|"
    body = ["| " + " | ".join(esc(plain(row[i])) for i in cols) + " |" for row in sheet.rows]
    title = []
    if sheet.title:
        first, *more = sheet.title.split("\n")
        title = ["  \n".join([f"**{esc(first)}**", *(esc(m) for m in more)]), ""]
    return "\n".join(title + [head, rule] + body) + "\n"


def console_width(console, environ) -> int:
    """The width tables fit: $COLUMNS when set, else the terminal's; a pipe or a file
    with no $COLUMNS gets a wide line (nothing folds there)."""
    cols = environ.get("COLUMNS", "")
    if cols.isdigit() and int(cols) > 0:
        return int(cols)
    return console.width if console.is_terminal else 200


def command_lines(command: str, width: int, indent: int = 0) -> list[str]:
    """A shell command in lines of at most width (an option kept with its value), each
    but the last ending in a backslash: pasted into a shell it is one command, and no
    id in it is broken. A word longer than a line gets a line of its own."""
    if indent + len(command) <= width:
        return [" " * indent + command]
    words = command.split(" ")
    groups: list[str] = []
    for w in words:
        if groups and not w.startswith("-") and groups[-1].startswith("-") \
                and " " not in groups[-1]:
            groups[-1] += " " + w  # an option and its value stay together
        else:
            groups.append(w)
    # (an option whose value does not fit a line beside it: the value on a line of its own)
    groups = [part for g in groups
              for part in (g.split(" ", 1) if indent + 6 + len(g) > width else [g])]
    lines, line = [], ""
    for g in groups:
        if line and indent + len(line) + 1 + len(g) + 2 > width:
            lines.append(line + " \\")
            line = "    " + g
        else:
            line = f"{line} {g}" if line else g
    lines.append(line)
    return [" " * indent + ln for ln in lines]
