"""What the instructor reads, made harmless: text shown as it is, cells that stay text, safe names.

Everything a grade shows or writes may hold text a student chose: a notebook's or folder's
name, a name cell, an exception's message, an answer's type. Three rules keep it inert:

- `visible(text)`: control and invisible formatting characters are written out as escapes
  (`\\x1b`, `\\u202e`), so an ANSI escape cannot redraw the terminal (hiding the line "score:
  0/6" behind a table of passes), a carriage return cannot overwrite a line, and a
  right-to-left override cannot reorder one; newlines too unless kept (`newlines=True`,
  for text that is shown as a block: a feedback page). Used for the terminal and HTML.
- `cell(value)`: a CSV cell a spreadsheet cannot take for a formula: text that starts with
  `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'` (OWASP, "CSV
  Injection"); numbers, text that is just a number (`-3`) and a lone `-` stay as they are.
- `file_name(text)`: one harmless path component (no `/`, no `..`, no control character),
  for files named after students: a name never chooses where a file is written.
"""

from __future__ import annotations

import re
import unicodedata

# C0 and C1 controls (but the newline), DEL, and the invisible formatting characters that
# reorder or hide text (soft hyphen, zero-width, bidirectional marks, overrides and
# isolates, line and paragraph separators, word joiners, BOM, tags), and lone surrogates.
_HIDDEN = (
    "\x00-\x09\x0b-\x1f\x7f-\x9f\u00ad\u061c\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e"
    "\u2060-\u206f\u3164\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f"
)
HIDDEN = re.compile(f"[{_HIDDEN}]")
HIDDEN_OR_NEWLINE = re.compile(f"[{_HIDDEN}\n]")
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
UNSAFE_IN_NAMES = re.compile(r'[/\\:*?"<>|\x00-\x1f\x7f]')


def _escape(found: re.Match) -> str:
    return found.group().encode("unicode_escape", "backslashreplace").decode("ascii")


def visible(text: object, newlines: bool = False) -> str:
    """`text` with every control or invisible formatting character written as its escape."""
    text = str(text)
    return (HIDDEN if newlines else HIDDEN_OR_NEWLINE).sub(_escape, text)


def cell(value: object) -> object:
    """`value` as a CSV cell no spreadsheet runs: see the module's docstring."""
    if (
        isinstance(value, str)
        and value.startswith(FORMULA_START)
        and not NUMBER.fullmatch(value)
        and value != "-"  # a lone minus is no formula (Moodle's "no grade")
    ):
        return "'" + value
    return value


def file_name(text: str, fallback: str = "unnamed") -> str:
    """`text` as one safe file or folder name (at most 100 characters)."""
    name = visible(unicodedata.normalize("NFC", str(text)))
    name = UNSAFE_IN_NAMES.sub("_", name).strip().lstrip(".").strip()
    return name[:100] or fallback
