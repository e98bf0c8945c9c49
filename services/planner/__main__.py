"""`python -m services.planner` runs the planner service."""

from services.planner.app import build
from shared.service import main

if __name__ == "__main__":
    main("planner", build)
