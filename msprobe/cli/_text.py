"""One line of a command's text view: values from a dump are printed with every control
character escaped, newlines included, so that a name can neither move the cursor nor fake
a line of the report (stdout keeps the newlines the command itself prints)."""
from __future__ import annotations

import sys
from typing import Any, Optional, TextIO

from msprobe.format.naming import printable

__all__ = ["say", "escape_cells"]


def say(text: Any = "", file: Optional[TextIO] = None) -> None:
    """Print ``text`` as exactly one line."""
    print(printable(str(text)), file=file or sys.stdout)


def escape_cells(df: Any) -> Any:
    """A pandas frame with its string cells escaped (a table's cells stay on their line)."""
    def esc(v: Any) -> Any:
        return printable(v) if isinstance(v, str) else v

    return df.map(esc) if hasattr(df, "map") else df.applymap(esc)
