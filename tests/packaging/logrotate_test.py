#!/usr/bin/env python3
"""ctest packaging.logrotate: the logrotate snippet is valid and really gets ingressd to write a new
file.

    logrotate_test.py SNIPPET UNIT INGRESSD_BINARY

1. `logrotate -d` reads the snippet as shipped without an error;
2. its postrotate names the shipped unit (packaging/systemd/ingressd.service);
3. end to end: ingressd (demo cluster on loopback) writes its access log into a temporary
   directory; logrotate -f runs the shipped snippet with only the log path changed and a
   `systemctl` stand-in first in PATH, which checks it was called as `systemctl kill` of the unit's
   main process with SIGUSR1 and sends that signal to this ingressd; afterwards the moved file
   keeps the first request's line and the next request's line goes to a new file at the path.
Exit 77 (ctest SKIP_RETURN_CODE) only when logrotate is not installed (Debian: logrotate)."""
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "contrib"))
import kit  # noqa: E402

SHIPPED_PATH = "/var/log/ingressd/*.log"


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def main():
    snippet, unit, binary = sys.argv[1:4]
    logrotate = shutil.which("logrotate") or ("/usr/sbin/logrotate" if os.path.exists("/usr/sbin/logrotate") else None)
    if not logrotate:
        print("SKIP: logrotate is not installed (Debian: logrotate)")
        return 77
    with open(snippet, encoding="utf-8") as f:
        text = f.read()
    problems = []

    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([logrotate, "-d", "-s", os.path.join(tmp, "debug.state"), snippet],
                           capture_output=True, text=True)
        errors = [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("error")]
        if r.returncode != 0 or errors:
            problems.append(f"logrotate -d {snippet} (exit {r.returncode}): {errors or r.stderr}")

        unit_name = os.path.basename(unit)
        m = re.search(r"^\s*systemctl kill [^\n]*?(\S+\.service)", text, re.M)
        if not m or m.group(1) != unit_name:
            problems.append(f"{snippet}: postrotate must `systemctl kill ... {unit_name}`")
        if SHIPPED_PATH not in text:
            problems.append(f"{snippet}: does not rotate {SHIPPED_PATH}")
        if problems:
            for p in problems:
                print("FAIL:", p)
            return 1

        logs = os.path.join(tmp, "log")
        os.mkdir(logs)
        access_log = os.path.join(logs, "access.log")
        with kit.Demo(binary, "--access-log", access_log) as daemon:
            # The stand-in: the arguments must be those `systemctl kill` needs to signal the
            # unit's main process with SIGUSR1; it then does what systemd would.
            bin_dir = os.path.join(tmp, "bin")
            os.mkdir(bin_dir)
            calls = os.path.join(tmp, "systemctl.calls")
            systemctl = os.path.join(bin_dir, "systemctl")
            with open(systemctl, "w", encoding="utf-8") as f:
                f.write("#!/bin/sh\n"
                        f'echo "$*" >> {calls}\n'
                        f'[ "$*" = "kill --kill-whom=main --signal=USR1 {unit_name}" ] || exit 3\n'
                        f"exec kill -USR1 {daemon.proc.pid}\n")
            os.chmod(systemctl, stat.S_IRWXU)
            config = os.path.join(tmp, "logrotate.conf")
            with open(config, "w", encoding="utf-8") as f:
                f.write(text.replace(SHIPPED_PATH, os.path.join(logs, "*.log")))

            status, _ = daemon.request("GET", "/v1/models")
            if status != 200:
                raise SystemExit(f"FAIL: GET /v1/models answered {status}\n{daemon.output()}")
            kit.wait_until(lambda: len(lines(access_log)) == 1, 5, "the first access log line")
            env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
            r = subprocess.run([logrotate, "-f", "-v", "-s", os.path.join(tmp, "state"), config],
                               capture_output=True, text=True, env=env)
            if r.returncode != 0:
                raise SystemExit(f"FAIL: logrotate -f (exit {r.returncode}):\n{r.stdout}{r.stderr}")
            if lines(calls) != [f"kill --kill-whom=main --signal=USR1 {unit_name}"]:
                problems.append(f"postrotate called systemctl as {lines(calls)}")
            kit.wait_until(lambda: "SIGUSR1: access log reopened" in daemon.output(), 5, "ingressd to reopen its log")
            status, _ = daemon.request("GET", "/echo/rotated")
            kit.wait_until(lambda: len(lines(access_log)) == 1, 5, "a line in the new access log")
            moved = lines(access_log + ".1")
            if len(moved) != 1 or "/v1/models" not in moved[0]:
                problems.append(f"access.log.1 should hold the first request's line only: {moved}")
            if "/echo/rotated" not in lines(access_log)[0]:
                problems.append(f"the new access.log should hold the second request: {lines(access_log)}")

    for p in problems:
        print("FAIL:", p)
    if problems:
        return 1
    print(f"OK: {snippet} is valid; logrotate moved the access log and ingressd wrote the next line to a new file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
