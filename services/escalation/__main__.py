"""`python -m services.escalation` runs the escalation service."""

from services.escalation.app import build
from shared.service import main

if __name__ == "__main__":
    main("escalation", build)
