"""Bench command lines: the flags the load benches share, and values that must lie in a range."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

__all__ = ["add_run_flags", "in_range", "parse_run_args"]


def in_range(
    kind: Callable[[str], float], low: float, high: float, unit: str = ""
) -> Callable[[str], float]:
    """An argparse `type`: `kind(text)`, refused ("must be 1-15000") outside low..high."""

    def parse(text: str) -> float:
        value = kind(text)
        if not low <= value <= high:
            shown = f"{low:,}-{high:,}" if kind is int else f"{low:g}-{high:g}"
            raise argparse.ArgumentTypeError(f"must be {shown}{unit}")
        return value

    return parse


def add_run_flags(p: argparse.ArgumentParser, quick: str, concurrency: int | None = None) -> None:
    """--quick (`quick` says what it runs), --json, and for the REST load benches
    --concurrency (default `concurrency`) and --seed."""
    if concurrency is not None:
        p.add_argument(
            "--concurrency",
            type=in_range(int, 1, 1000),
            default=concurrency,
            help=f"REST calls in flight ({concurrency})",
        )
        p.add_argument("--seed", type=int, default=1, help="random seed for the recipients")
    p.add_argument("--quick", action="store_true", help=f"smoke run: {quick}")
    p.add_argument("--json", action="store_true", help="also print the results as JSON")


def parse_run_args(
    p: argparse.ArgumentParser, argv: Sequence[str] | None, **quick: object
) -> argparse.Namespace:
    """`p.parse_args(argv)`; with --quick, the smoke run's values (`quick`) replace those
    of the flags they name."""
    args = p.parse_args(argv)
    if args.quick:
        for name, value in quick.items():
            setattr(args, name, value)
    return args
