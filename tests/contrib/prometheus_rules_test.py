#!/usr/bin/env python3
"""ctest contrib.prometheus_rules: the Prometheus rules are valid and unit-tested, and every alert
leads to its runbook.

    prometheus_rules_test.py RULES_YML RULES_TEST_YML TROUBLESHOOTING_MD

1. `promtool check rules` accepts the rules file;
2. `promtool test rules` passes, and it has, for every alert, a case in which the alert fires and
   one in which it does not (so that neither an alert that never fires nor one that always fires
   passes);
3. every alert has a severity, a summary, a description and a runbook_url
   `docs/troubleshooting.md#<anchor>` whose anchor is a heading of TROUBLESHOOTING_MD (GitHub's
   anchors: lower case, punctuation dropped, spaces as hyphens).
Exit 77 (ctest SKIP_RETURN_CODE) only when promtool is not installed (Debian: prometheus)."""
import os
import re
import shutil
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kit  # noqa: E402


def anchors(markdown_path):
    out = set()
    in_code = False
    with open(markdown_path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m and not in_code:
                slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
                out.add(slug)
    return out


def main():
    # Absolute: promtool runs in the test file's directory (below), where a relative path given
    # from the caller's directory names nothing.
    rules_path, tests_path, troubleshooting = (os.path.abspath(p) for p in sys.argv[1:4])
    problems = []
    rules = kit.load_yaml(rules_path)
    tests = kit.load_yaml(tests_path)
    alerts = [r for g in rules["groups"] for r in g["rules"] if "alert" in r]
    if not alerts:
        problems.append(f"{rules_path} has no alerts")

    known = anchors(troubleshooting)
    link = re.compile(r"^docs/troubleshooting\.md#([a-z0-9_-]+)$")
    for a in alerts:
        name = a["alert"]
        if a.get("labels", {}).get("severity") not in ("critical", "warning", "info"):
            problems.append(f"{name}: needs a severity label (critical, warning or info)")
        notes = a.get("annotations", {})
        for key in ("summary", "description", "runbook_url"):
            if not notes.get(key):
                problems.append(f"{name}: no {key} annotation")
        m = link.match(notes.get("runbook_url", ""))
        if not m:
            problems.append(f"{name}: runbook_url must be docs/troubleshooting.md#<anchor>, is {notes.get('runbook_url')!r}")
        elif m.group(1) not in known:
            problems.append(f"{name}: runbook anchor #{m.group(1)} is no heading of {troubleshooting}")

    fires, quiet = set(), set()
    for case in tests.get("tests", []):
        for t in case.get("alert_rule_test", []):
            (fires if t.get("exp_alerts") else quiet).add(t["alertname"])
    for a in alerts:
        if a["alert"] not in fires:
            problems.append(f"{a['alert']}: {tests_path} has no case in which it fires")
        if a["alert"] not in quiet:
            problems.append(f"{a['alert']}: {tests_path} has no case in which it does not fire")
    unknown = (fires | quiet) - {a["alert"] for a in alerts}
    if unknown:
        problems.append(f"{tests_path} tests alerts that {rules_path} does not have: {sorted(unknown)}")

    if not shutil.which("promtool"):
        for p in problems:
            print("FAIL:", p)
        if problems:
            return 1
        print("SKIP: promtool is not installed (Debian: prometheus); runbooks and test coverage are fine")
        return 77
    for command in (["promtool", "check", "rules", rules_path], ["promtool", "test", "rules", tests_path]):
        # promtool test rules reads rule_files relative to the test file's directory.
        r = subprocess.run(command, capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(tests_path)))
        if r.returncode != 0:
            problems.append(f"{' '.join(command)} failed:\n{r.stdout}{r.stderr}")

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"OK: {len(alerts)} alerts, each with a runbook and a firing and a quiet test; promtool check and test pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
