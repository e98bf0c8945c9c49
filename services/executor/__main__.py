"""`python -m services.executor` runs the executor service."""

from services.executor.app import build
from shared.service import main

if __name__ == "__main__":
    main("executor", build)
