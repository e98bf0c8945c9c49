"""`python -m services.governor` runs the governor service."""

from services.governor.app import build
from shared.service import main

if __name__ == "__main__":
    main("governor", build)
