"""`python -m services.judge` runs the judge service."""

from services.judge.app import build
from shared.service import main

if __name__ == "__main__":
    main("judge", build)
