"""The Ray driver's side of ``test_ray_convert.py``, run in a child interpreter
(:class:`support.child.ChildInterpreter`): Ray's core worker lives in its driver's
process and can abort it, which must fail one test, not end the pytest run."""

from __future__ import annotations

import argparse

from fastload.cli import convert as convert_cli


def start_ray() -> None:
    """The local Ray runtime the tests convert on: 2 CPUs, no dashboard."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)


def stop_ray() -> None:
    import ray

    ray.shutdown()


def run_cli(argv: list[str]) -> int:
    """``fastload`` + ``argv`` for the ``convert`` commands; its exit code."""
    parser = argparse.ArgumentParser(prog="fastload")
    convert_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code
