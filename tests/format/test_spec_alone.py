"""spec/ stands alone: its text states every rule in its own words and points nowhere outside
spec/ (no path into tests/, docs/ or the package, no module of the package, no file of the
repository but spec/'s own, no test suite by name), and each document's contents list every
section it has. Which test keeps which rule is said by the developers' documentation
(docs/architecture.md, "What keeps spec/ true"), never by the spec."""
from __future__ import annotations

import re

import pytest
from _fmt_support import SPEC

#: a pointer out of spec/: a repository path, a dotted module of the package, a file name
#: (``.py``, ``.yaml``, ``.c``, ``.js``) that spec/ does not hold, or a test suite by name.
#: Absolute and elided paths of example data (``/work/train.py``, ``.../spawn.py``) are not.
POINTER = re.compile(r"(?<![\w/.-])(?:(?:tests|docs|msprobe|bench|scripts|frontend)/[\w./-]+"
                     r"|msprobe\.[a-z_][\w.]*"
                     r"|[\w-]+\.(?:py|yaml|c|js)\b"
                     r"|(?i:zoo|fixtures?)\b)")
OWN = {path.name for path in SPEC.rglob("*") if path.is_file()}


def pointers(text: str) -> list:
    """(line, pointer) of every pointer out of spec/ in ``text``."""
    return [(number, found.group(0)) for number, line in enumerate(text.splitlines(), 1)
            for found in POINTER.finditer(line) if found.group(0) not in OWN]


def test_spec_points_nowhere_outside_spec():
    found = {str(md.relative_to(SPEC)): pointers(md.read_text(encoding="utf-8")) for md in sorted(SPEC.rglob("*.md"))}
    found = {name: hits for name, hits in found.items() if hits}
    assert sum(map(len, found.values())) == 0, (
        "state the rule in the spec's own words; which test keeps it is for docs/architecture.md to say:\n"
        + "\n".join(f"spec/{name}:{line}: {what}" for name, hits in found.items() for line, what in hits))


def test_the_measure_sees_every_kind_of_pointer():
    text = ("see tests/dumpers/test_zoo.py and docs/compare.md\n"
            "(`msprobe.format.comm`, `msprobe/online/packet.py`, `support_wrap_ops.yaml`)\n"
            "the wild zoo; conformance fixtures `jit_bc_*`\n"
            "the independent `reader.py` and `writer.py`; a stack of /work/train.py and .../spawn.py\n"
            "msprobe-lake writes `msprobe_lake.json`; run `msprobe compare --layout`")
    assert [what for _, what in pointers(text)] == [
        "tests/dumpers/test_zoo.py", "docs/compare.md", "msprobe.format.comm", "msprobe/online/packet.py",
        "support_wrap_ops.yaml", "zoo", "fixtures"], pointers(text)


def _contents(text: str) -> list:
    """The numbered lines of the document's ``Contents`` list."""
    block = text.split("\nContents\n", 1)[1].strip("\n").split("\n\n", 1)[0]
    return block.splitlines()


@pytest.mark.parametrize("document", ["FORMAT.md", "PRODUCER.md"])
def test_contents_list_every_section(document):
    text = (SPEC / document).read_text(encoding="utf-8")
    sections = re.findall(r"^## (\d+)\. (.+)$", text, re.M)
    assert sections, document
    listed = _contents(text)
    missing = [f"{number}. {title}" for number, title in sections
               if not any(line == f"{number}. {title}" or line.startswith(f"{number}. {title} (") for line in listed)]
    assert not missing, f"{document}'s contents miss (or misname) {missing}; it lists {listed}"
    assert len(listed) == len(sections), (listed, sections)
