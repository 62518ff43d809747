"""The logic of `python -m mgjit.cache`: list, stats, clear and prune the kernel cache."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import TextIO

from .store import EntryInfo, Store, parse_size


def human_size(n: int) -> str:
    """1536 -> '1.5 KiB'."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} TiB"


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _summary(infos: Sequence[EntryInfo]) -> str:
    n = len(infos)
    return f"{n} {'entry' if n == 1 else 'entries'} ({human_size(sum(i.size for i in infos))})"


def _cell(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), sort_keys=True)


def cmd_list(store: Store, out: TextIO) -> None:
    infos = sorted(store.entries(with_meta=True), key=lambda i: i.last_used, reverse=True)
    if not infos:
        print(f"no entries in {store.root}", file=out)
        return
    # The specialization goes last and whole: it is long, and its end (the constexprs) tells entries apart.
    rows = [("KEY", "NAME", "TARGET", "SIZE", "LAST USE", "SPECIALIZATION")]
    for i in infos:
        m = i.meta
        if m is None:
            rows.append((i.key[:12], "(damaged)", "", human_size(i.size), _when(i.last_used), ""))
        else:
            rows.append(
                (
                    i.key[:12],
                    _cell(m.get("name", "?")),
                    _cell(m.get("target", "?")),
                    human_size(i.size),
                    _when(i.last_used),
                    _cell(m.get("specialization", "")),
                )
            )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for r in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip(), file=out)


def cmd_stats(store: Store, out: TextIO) -> None:
    infos = store.entries()
    total = sum(i.size for i in infos)
    print(f"directory: {store.root}", file=out)
    print(f"entries:   {len(infos)}", file=out)
    print(f"size:      {human_size(total)} ({total} bytes)", file=out)
    print(f"limit:     {human_size(store.max_bytes)} ({store.max_bytes} bytes)", file=out)
    print(f"redis:     {store.redis.status() if store.redis is not None else 'not configured'}", file=out)


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run the command line; returns the exit status."""
    out = sys.stdout if out is None else out
    p = argparse.ArgumentParser(
        prog="python -m mgjit.cache",
        description="Inspect and trim mgjit's kernel cache "
        "(configured by MGJIT_CACHE_DIR, MGJIT_CACHE_MAX_BYTES, MGJIT_CACHE_REDIS).",
    )
    p.add_argument("--dir", help="cache directory (default: $MGJIT_CACHE_DIR or ~/.cache/mgjit)")
    sub = p.add_subparsers(dest="command", required=True, metavar="{list,stats,clear,prune}")
    sub.add_parser("list", help="one line per entry: kernel, specialization, target, size, last use")
    sub.add_parser("stats", help="entries, bytes, limit, directory and Redis status")
    sub.add_parser("clear", help="remove every entry")
    pr = sub.add_parser(
        "prune",
        help="remove entries unused for DAYS, then least-recently-used ones above the size limit",
    )
    pr.add_argument("--max-bytes", type=_size_arg, metavar="N", help="size to prune to, e.g. 500M (default: the limit)")
    pr.add_argument("--older-than", type=float, metavar="DAYS", help="remove entries not used for DAYS days")
    args = p.parse_args(argv)

    store = Store.from_env(root=args.dir)
    if args.command in ("clear", "prune") and store.root != store.requested:
        # The store warned why it refused the directory; removing entries elsewhere is not what was asked.
        print(f"not clearing or pruning {store.requested}: mgjit does not use it (see the warning above)", file=out)
        return 1
    if args.command == "list":
        cmd_list(store, out)
    elif args.command == "stats":
        cmd_stats(store, out)
    elif args.command == "clear":
        print(f"removed {_summary(store.clear())} from {store.root}", file=out)
    else:
        older = None if args.older_than is None else args.older_than * 86400.0
        removed = store.prune(max_bytes=args.max_bytes, older_than=older)
        print(f"removed {_summary(removed)}; kept {_summary(store.entries())} in {store.root}", file=out)
    return 0
