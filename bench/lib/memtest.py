"""What the memory tests (idle_conns.py, sse_streams.py) share: the proxy's RSS and their flags."""
import argparse


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def arg_parser(default_path):
    """--host/--port of the proxy, --pid to read RSS from, --n connections in --batch steps."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--batch", type=int, default=250)
    ap.add_argument("--path", default=default_path)
    ap.add_argument("--settle", type=float, default=1.0)
    return ap
