"""`python -m services.validator` runs the validator service."""

from services.validator.app import build
from shared.service import main

if __name__ == "__main__":
    main("validator", build)
