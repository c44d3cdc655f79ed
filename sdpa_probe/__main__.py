"""python -m sdpa_probe: the `probe` command."""

from .cli import main

if __name__ == "__main__":
    main()
