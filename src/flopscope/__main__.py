"""``python -m flopscope``: the command line. Ctrl-C is handled from this module's first line
(:mod:`flopscope.cli.interrupt`)."""

import signal

_early: list[int] = []  # a SIGINT before the handler below is installed: reported as one
signal.signal(signal.SIGINT, lambda signum, frame: _early.append(signum))

from flopscope.cli import interrupt  # noqa: E402  (after the first handler)

interrupt.install()
if _early:
    interrupt.say()
    interrupt.finish(interrupt.EXIT_INTERRUPTED)

try:
    from flopscope.cli import main_entry  # noqa: E402  (after the handler: Ctrl-C while it imports)
except KeyboardInterrupt:
    interrupt.say()
    interrupt.finish(interrupt.EXIT_INTERRUPTED)

if __name__ == "__main__":
    main_entry()
