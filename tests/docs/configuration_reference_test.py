#!/usr/bin/env python3
"""ctest docs.configuration_reference: docs/configuration.md documents every flag and every config
key, no more, in the order of `ingressd --help` and config/ingressd.example.yaml, with the
example's defaults.

    configuration_reference_test.py DOC EXAMPLE_YAML INGRESSD_BINARY

The example config is the reference for keys and defaults because a unit test
(ConfigExample.LoadsAndEqualsDefaults) holds it equal to the compiled-in defaults; the flags come
from the binary's own --help. Standard library only.
"""
import re
import subprocess
import sys

SIGHUP_KINDS = {"yes", "rejected", "restart"}


def unquote(value):
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def example_keys(path):
    """[(dotted key, default as written)] in file order. The example is flat YAML: top-level keys
    and one level of sections, `key: value  # comment` per line."""
    keys = []
    section = None
    line_re = re.compile(r"^(\s*)([A-Za-z_]+):\s*(.*?)\s*(?:\s#.*)?$")
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = line_re.match(line.rstrip("\n"))
            if not m:
                raise SystemExit(f"{path}:{number}: cannot read this line: {line!r}")
            indent, name, value = m.groups()
            if not indent and not value:
                section = name
                continue
            keys.append((f"{section}.{name}" if indent else name, unquote(value)))
    return keys


def help_flags(binary):
    out = subprocess.run([binary, "--help"], check=True, capture_output=True, text=True).stdout
    return re.findall(r"^\s+(--[a-z][a-z-]*)", out, re.M)


def doc_sections(path):
    """{"## heading": [lines]} for the page's second-level sections."""
    sections = {}
    current = None
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            if not in_code and line.startswith("## "):
                current = line[3:].strip()
                sections[current] = []
            elif current is not None:
                sections[current].append(line.rstrip("\n"))
    return sections


def entries(lines):
    """[(name in the ### heading's backticks, [lines below it])]."""
    out = []
    for line in lines:
        m = re.match(r"^### `([^`]+)`\s*$", line)
        if m:
            out.append((m.group(1), []))
        elif line.startswith("### "):
            raise SystemExit(f"heading without a `name`: {line!r}")
        elif out:
            out[-1][1].append(line)
    return out


def first_table_row(lines):
    rows = [l for l in lines if l.startswith("|")]
    if len(rows) < 3 or not re.match(r"^\|[-| ]+\|$", rows[1]):
        return None
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    cells = [c.strip() for c in rows[2].strip("|").split("|")]
    return dict(zip(header, cells)) if len(header) == len(cells) else None


def main():
    doc, example, binary = sys.argv[1:4]
    problems = []
    sections = doc_sections(doc)
    for needed in ("Command-line flags", "Configuration keys"):
        if needed not in sections:
            raise SystemExit(f"{doc}: no '## {needed}' section")

    def same_list(what, want, want_from, got):
        if got != want:
            missing = [x for x in want if x not in got]
            extra = [x for x in got if x not in want]
            problems.append(f"{what}: {want_from} lists {want}, {doc} documents {got}"
                            f" (missing: {missing}; not in {want_from}: {extra})")

    flags = help_flags(binary)
    same_list("flags", flags, "--help", [name.split()[0] for name, _ in entries(sections["Command-line flags"])])
    keys = example_keys(example)
    documented = entries(sections["Configuration keys"])
    same_list("keys (names and order)", [k for k, _ in keys], example, [k for k, _ in documented])

    defaults = dict(keys)
    columns = ["type", "default", "units", "valid range", "flag", "SIGHUP"]
    for name, lines in documented:
        row = first_table_row(lines)
        if row is None or list(row) != columns:
            problems.append(f"{name}: needs a table with the columns {' | '.join(columns)}")
            continue
        if name in defaults and unquote(row["default"].strip("`")) != defaults[name]:
            problems.append(f"{name}: {doc} says default {row['default']}, {example} says {defaults[name]!r}")
        if row["SIGHUP"] not in SIGHUP_KINDS:
            problems.append(f"{name}: SIGHUP must be one of {sorted(SIGHUP_KINDS)}, got {row['SIGHUP']!r}")
        flag = row["flag"].strip("`")
        if flag != "—" and flag not in flags:
            problems.append(f"{name}: flag {row['flag']} is not in --help")
        if not any(l.strip() and not l.startswith("|") for l in lines):
            problems.append(f"{name}: no description below the table")

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"OK: {len(flags)} flags and {len(keys)} keys documented in order with the example's defaults")
    return 0


if __name__ == "__main__":
    sys.exit(main())
