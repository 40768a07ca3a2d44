"""`python -m service.cli ...` is `hookserve ...`."""

from __future__ import annotations

from service.cli.main import main

if __name__ == "__main__":
    main()
