"""``python -m flopscope``: the command line."""

from flopscope.cli import main_entry

if __name__ == "__main__":
    main_entry()
